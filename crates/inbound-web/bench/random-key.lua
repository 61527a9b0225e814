-- wrk script: GET with a random x-api-key over 1,000,000 subjects.
math.randomseed(os.time())
request = function()
  return wrk.format("GET", nil, { ["x-api-key"] = tostring(math.random(1, 1000000)) })
end
