-- wrk script: POST /v1/evaluate with a random subject over 1,000,000.
math.randomseed(os.time())
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
request = function()
  local body = '{"policy":"api","subject":"user-' .. math.random(1, 1000000) .. '","cost":1}'
  return wrk.format("POST", "/v1/evaluate", nil, body)
end
