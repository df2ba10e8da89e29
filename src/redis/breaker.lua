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
local op = ARGV[1]
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if op == 'trip' then
  local open_ms, quorum, window = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
  redis.call('ZADD', KEYS[4], now_ms, ARGV[2])
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now_ms - window)
  redis.call('PEXPIRE', KEYS[4], window)
  if redis.call('ZCARD', KEYS[4]) < quorum then return 0 end
  if redis.call('PTTL', KEYS[1]) > 0 then return redis.call('PTTL', KEYS[1]) end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', open_ms)
  redis.call('SET', KEYS[2], open_ms, 'PX', open_ms * 4 + window)
  redis.call('DEL', KEYS[3])
  return open_ms
elseif op == 'reopen' then
  local last = tonumber(redis.call('GET', KEYS[2]) or ARGV[3]) or tonumber(ARGV[3])
  local open_ms = math.min(last * 2, tonumber(ARGV[4]))
  redis.call('SET', KEYS[1], ARGV[2], 'PX', open_ms)
  redis.call('SET', KEYS[2], open_ms, 'PX', open_ms * 4 + 60000)
  redis.call('DEL', KEYS[3])
  return open_ms
elseif op == 'claim' then
  if redis.call('PTTL', KEYS[1]) > 0 then return 0 end
  if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
  if redis.call('SET', KEYS[3], ARGV[2], 'NX', 'PX', tonumber(ARGV[3])) then return 1 end
  return 0
elseif op == 'close' then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
  return 1
end
return redis.error_reply('unknown operation ' .. tostring(op))
