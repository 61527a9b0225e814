-- wrk script for the soak run: one kind of request per wrk process, at a paced rate, and the
-- count of each HTTP status printed at the end ("status CODE COUNT").
--   wrk ... -s load.lua URL -- KIND DELAY_MS
--   KIND: api      GET the middleware route, random x-api-key over 1,000,000 (1 in 20 "hot")
--         evaluate POST /v1/evaluate, random subject over 1,000,000
--         gate     POST /v1/gates/orders/events, random key over 1,000,000, server-made id
-- Each connection waits DELAY_MS before each request, so the rate is about
-- connections * 1000 / (DELAY_MS + latency).
local threads = {}
function setup(thread) table.insert(threads, thread) end

local random = math.random
local kind, pause, head
function init(args)
  math.randomseed(os.time() + (tonumber(tostring({}):match("0x(%x+)"), 16) or 0))
  kind = args[1] or "api"
  pause = tonumber(args[2] or "10")
  statuses = {}
  if kind == "api" then
    head = "GET " .. wrk.path .. " HTTP/1.1\r\nHost: " .. wrk.host .. "\r\nx-api-key: "
  else
    head = "POST " .. wrk.path .. " HTTP/1.1\r\nHost: " .. wrk.host
      .. "\r\ncontent-type: application/json\r\nContent-Length: "
  end
end

function request()
  if kind == "api" then
    local key = (random(1, 20) == 1) and "hot" or random(1, 1000000)
    return head .. key .. "\r\n\r\n"
  end
  local body
  if kind == "evaluate" then
    body = '{"policy":"api","subject":"user-' .. random(1, 1000000) .. '","cost":1}'
  else
    body = '{"key":"k-' .. random(1, 1000000) .. '"}'
  end
  return head .. #body .. "\r\n\r\n" .. body
end

function delay() return pause end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
  local total = {}
  for _, t in ipairs(threads) do
    for code, n in pairs(t:get("statuses")) do total[code] = (total[code] or 0) + n end
  end
  for code, n in pairs(total) do io.write(string.format("status %d %d\n", code, n)) end
  local e = summary.errors
  io.write(string.format("errors connect %d read %d write %d timeout %d status %d\n",
    e.connect, e.read, e.write, e.timeout, e.status))
end
