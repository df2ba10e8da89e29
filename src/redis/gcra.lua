-- GCRA over one or more token buckets, atomically: up to ARGV[1] tokens are
-- taken from every bucket in KEYS together (a task's service and node
-- buckets), or none once one of them is empty.
--
-- KEYS[i]          bucket i: its theoretical arrival time (TAT), integer
--                  microseconds on the Redis clock. Absent: full.
-- ARGV[1]          tokens wanted (>= 1)
-- ARGV[2i]         emission interval of bucket i, µs (>= 1)
-- ARGV[2i+1]       tolerance of bucket i, µs: interval * (burst - 1)
-- ARGV[2n+2]       optional, tests only: `now` in µs instead of Redis TIME
--
-- A token is admitted at `now` when TAT <= now + tolerance, and then
-- TAT = max(TAT, now) + interval (the local `TokenBucket`'s rule, in µs).
-- Each key expires when its bucket is full again (TAT - now), so idle
-- buckets leave nothing behind (not under a forced `now`).
--
-- Returns { granted, retry_us, now_us }: retry_us is how long until the
-- next token when fewer than wanted were granted (0 otherwise).
local n = #KEYS
local want = tonumber(ARGV[1])
local now
local forced = ARGV[2 * n + 2]
if forced then
  now = tonumber(forced)
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local tat, iv, tol = {}, {}, {}
for i = 1, n do
  iv[i] = tonumber(ARGV[2 * i])
  tol[i] = tonumber(ARGV[2 * i + 1])
  local v = tonumber(redis.call('GET', KEYS[i]) or '0') or 0
  if v < now then v = now end
  tat[i] = v
end
local granted, retry = 0, 0
-- Bounded: at most `want` rounds.
while granted < want do
  local ok = true
  for i = 1, n do
    if tat[i] > now + tol[i] then
      ok = false
      local wait = tat[i] - tol[i] - now
      if wait > retry then retry = wait end
    end
  end
  if not ok then break end
  for i = 1, n do tat[i] = tat[i] + iv[i] end
  granted = granted + 1
end
if granted > 0 then
  for i = 1, n do
    local ttl = math.ceil((tat[i] - now) / 1000)
    if ttl < 1 then ttl = 1 end
    if forced then
      -- A forced clock is not the one the expiry runs on: keep the key.
      redis.call('SET', KEYS[i], string.format('%.0f', tat[i]))
    else
      redis.call('SET', KEYS[i], string.format('%.0f', tat[i]), 'PX', ttl)
    end
  end
end
return { granted, retry, now }
