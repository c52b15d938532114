-- wrk script for benches/http.sh: POST /v1/messages with a raw 4 KiB
-- message and a unique Idempotency-Key per request (thread id + counter),
-- so every request is a first acceptance, not a replay.
local counter = 0
local thread_id = 0
local threads = {}

function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  thread_id = id
  local size = tonumber(os.getenv("SIZE") or "4096")
  local head = "From: bench@example.test\r\nTo: sink@example.test\r\nSubject: bench\r\n\r\n"
  local line = string.rep("x", 76) .. "\r\n"
  local body = head
  while #body + #line <= size do body = body .. line end
  wrk.method = "POST"
  wrk.path = "/v1/messages?from=bench%40example.test&to=sink%40example.test"
  wrk.body = body
  wrk.headers["Content-Type"] = "message/rfc822"
  wrk.headers["Authorization"] = "Bearer " .. os.getenv("TOKEN")
end

function request()
  counter = counter + 1
  wrk.headers["Idempotency-Key"] = string.format("%s-%d-%d", os.getenv("PREFIX") or "k", thread_id, counter)
  return wrk.format()
end

local statuses = {}
function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
  io.write(string.format("JSON {\"requests\": %d, \"seconds\": %.3f, \"p50_ms\": %.3f, \"p90_ms\": %.3f, \"p99_ms\": %.3f, \"errors\": %d}\n",
    summary.requests, summary.duration / 1e6, latency:percentile(50) / 1000, latency:percentile(90) / 1000, latency:percentile(99) / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout + summary.errors.status))
end
