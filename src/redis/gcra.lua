-- GCRA over token buckets, for several asks at once, atomically: each ask
-- names the buckets a token of it needs (a task's service bucket and its
-- node's bucket) and how many tokens it wants; a token is taken from every
-- bucket of its ask together, or from none of them.
--
-- KEYS[b]          bucket b: its theoretical arrival time (TAT), integer
--                  microseconds on the Redis clock. Absent: full.
-- ARGV[1]          number of asks, m
-- ARGV[2b], ARGV[2b+1]
--                  emission interval of bucket b, µs (>= 1), and its
--                  tolerance, µs: interval * (burst - 1)
-- then, per ask:   want (>= 0), c, and c bucket numbers (1-based)
-- then, optional, tests only: `now` in µs instead of Redis TIME
--
-- A token is admitted at `now` when TAT <= now + tolerance in each of its
-- buckets, and then TAT = max(TAT, now) + interval in each (the local
-- `TokenBucket`'s rule, in µs). Asks take turns one token at a time, so a
-- bucket they share (the service's) is split evenly when it binds.
-- Each key expires when its bucket is full again (TAT - now), so idle
-- buckets leave nothing behind (not under a forced `now`).
--
-- Redis content is untrusted: a bucket key of another type (a list, a
-- hash), a value that is not a number, or a TAT past what a grant can
-- leave (now + tolerance + interval; `1e300` would stop traffic for good)
-- is replaced by a full bucket, and named in the answer's last element:
-- { b, what, b, what, ... } (b the bucket's 1-based key, what it held).
--
-- Returns { now_us, granted_1, due_1, ..., granted_m, due_m, repaired }:
-- due_a is how
-- long, in µs, until ask a's buckets hold its tokens again (want tokens, at
-- most half of each bucket's burst, rounded up; 0 when they are there now).
-- An instance need not ask before then: it would get less.
local n = #KEYS
local m = tonumber(ARGV[1])
local iv, tol, tat, burst = {}, {}, {}, {}
local p = 2
for b = 1, n do
  iv[b] = tonumber(ARGV[p])
  tol[b] = tonumber(ARGV[p + 1])
  burst[b] = math.floor(tol[b] / iv[b]) + 1
  p = p + 2
end
local want, idx = {}, {}
for a = 1, m do
  want[a] = tonumber(ARGV[p])
  local c = tonumber(ARGV[p + 1])
  idx[a] = {}
  for j = 1, c do idx[a][j] = tonumber(ARGV[p + 1 + j]) end
  p = p + 2 + c
end
local now
local forced = ARGV[p]
if forced then
  now = tonumber(forced)
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local repaired = {}
local function repair(b, what)
  redis.call('DEL', KEYS[b])
  repaired[#repaired + 1] = b
  repaired[#repaired + 1] = what
end
for b = 1, n do
  local kind = redis.call('TYPE', KEYS[b]).ok
  local v = now
  if kind == 'string' then
    v = tonumber(redis.call('GET', KEYS[b]))
    if v == nil or v ~= v then
      repair(b, 'a string that is not a number')
      v = now
    elseif v > now + tol[b] + iv[b] then
      repair(b, 'a time past any grant (' .. string.format('%.0f', v - now) .. ' us ahead)')
      v = now
    end
  elseif kind ~= 'none' then
    repair(b, 'a ' .. kind)
  end
  if v < now then v = now end
  tat[b] = v
end
local granted, open, touched = {}, {}, {}
for a = 1, m do
  granted[a] = 0
  open[a] = want[a] > 0
end
-- Bounded: every round grants a token or closes an ask.
local busy = true
while busy do
  busy = false
  for a = 1, m do
    if open[a] then
      local ok = true
      for _, b in ipairs(idx[a]) do
        if tat[b] > now + tol[b] then ok = false end
      end
      if ok then
        for _, b in ipairs(idx[a]) do
          tat[b] = tat[b] + iv[b]
          touched[b] = true
        end
        granted[a] = granted[a] + 1
        open[a] = granted[a] < want[a]
        busy = busy or open[a]
      else
        open[a] = false
      end
    end
  end
end
for b = 1, n do
  if touched[b] then
    local ttl = math.ceil((tat[b] - now) / 1000)
    if ttl < 1 then ttl = 1 end
    if forced then
      -- A forced clock is not the one the expiry runs on: keep the key.
      redis.call('SET', KEYS[b], string.format('%.0f', tat[b]))
    else
      redis.call('SET', KEYS[b], string.format('%.0f', tat[b]), 'PX', ttl)
    end
  end
end
local out = { now }
for a = 1, m do
  local due = 0
  local k = want[a]
  if k < 1 then k = 1 end
  for _, b in ipairs(idx[a]) do
    local kb = math.min(k, math.ceil(burst[b] / 2))
    local wait = tat[b] + (kb - 1) * iv[b] - tol[b] - now
    if wait > due then due = wait end
  end
  out[#out + 1] = granted[a]
  out[#out + 1] = due
end
out[#out + 1] = repaired
return out
