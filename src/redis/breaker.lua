-- A node's breaker shared by several instances.
--
-- KEYS[1] open: present while the node is open (PX = open time)
-- KEYS[2] tripped: the open time in ms, present from a trip until a probe
--         succeeds; once `open` has expired it means half-open
-- KEYS[3] probe: the one instance allowed to probe (SET NX PX)
-- KEYS[4] reports: sorted set of instances that saw the node trip
-- ARGV[1] operation: trip | reopen | claim | close
--
-- trip   ARGV[2] instance, ARGV[3] open ms, ARGV[4] quorum, ARGV[5] report
--        window ms. Opens when `quorum` instances reported within the window.
--        Returns the open time in ms, or 0 while below quorum.
-- reopen ARGV[2] instance, ARGV[3] first open ms, ARGV[4] max open ms:
--        a failed probe; opens again for twice the last open time (capped).
-- claim  ARGV[2] instance, ARGV[3] probe ttl ms: 1 if this instance may
--        probe (half-open, nobody else claimed it), else 0.
-- close  a probe succeeded: closed for everyone. Returns 1.
--
-- All times are Redis TIME; keys share the service's hash tag.
--
-- Redis content is untrusted: a key of another type than this script
-- writes is deleted first; a `tripped` value is bounded to the open times
-- given; a probe claim that no instance of this script can have set (no
-- expiry, or longer than the probe ttl) is dropped, so no foreign key can
-- shut a node out for every instance.
--
-- Every operation returns { answer, repaired }: repaired names each key
-- replaced, { i, what, i, what, ... } (i the key's 1-based index, what it
-- held), so the caller can log it.
local op = ARGV[1]
local repaired = {}
local function repair(i, what)
  redis.call('DEL', KEYS[i])
  repaired[#repaired + 1] = i
  repaired[#repaired + 1] = what
end
local want = { 'string', 'string', 'string', 'zset' }
for i = 1, 4 do
  local kind = redis.call('TYPE', KEYS[i]).ok
  if kind ~= 'none' and kind ~= want[i] then
    repair(i, 'a ' .. kind)
  end
end
local function answer(v)
  return { v, repaired }
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if op == 'trip' then
  local open_ms, quorum, window = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
  redis.call('ZADD', KEYS[4], now_ms, ARGV[2])
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now_ms - window)
  redis.call('PEXPIRE', KEYS[4], window)
  if redis.call('ZCARD', KEYS[4]) < quorum then return answer(0) end
  if redis.call('PTTL', KEYS[1]) > 0 then return answer(redis.call('PTTL', KEYS[1])) end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', open_ms)
  redis.call('SET', KEYS[2], open_ms, 'PX', open_ms * 4 + window)
  redis.call('DEL', KEYS[3])
  return answer(open_ms)
elseif op == 'reopen' then
  local first, max = tonumber(ARGV[3]), tonumber(ARGV[4])
  local last = tonumber(redis.call('GET', KEYS[2]) or ARGV[3]) or first
  if last ~= last or last < first then last = first end
  if last > max then last = max end
  local open_ms = math.floor(math.min(last * 2, max))
  if open_ms < 1 then open_ms = 1 end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', open_ms)
  redis.call('SET', KEYS[2], open_ms, 'PX', open_ms * 4 + 60000)
  redis.call('DEL', KEYS[3])
  return answer(open_ms)
elseif op == 'claim' then
  local ttl = tonumber(ARGV[3])
  local held = redis.call('PTTL', KEYS[3])
  if held == -1 then
    repair(3, 'a probe claim without expiry')
  elseif held > ttl then
    repair(3, 'a probe claim longer than the probe timeout (' .. held .. ' ms)')
  end
  if redis.call('PTTL', KEYS[1]) > 0 then return answer(0) end
  if redis.call('EXISTS', KEYS[2]) == 0 then return answer(0) end
  if redis.call('SET', KEYS[3], ARGV[2], 'NX', 'PX', ttl) then return answer(1) end
  return answer(0)
elseif op == 'close' then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
  return answer(1)
end
return redis.error_reply('unknown operation ' .. tostring(op))
