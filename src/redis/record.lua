-- Records the one result (or dead letter) of a stream entry, acknowledges
-- and deletes the entry, all at once.
--
-- KEYS[1] the task stream, KEYS[2] the stream to add to (results or dead),
-- KEYS[3] the entry's done-marker, KEYS[4] the entry's last-error key.
-- ARGV[1] the consumer group, ARGV[2] the entry id, ARGV[3] the marker's
-- TTL (ms), ARGV[4] the `MAXLEN ~` of KEYS[2], ARGV[5..] field/value pairs
-- of the entry to add.
--
-- Redis content is untrusted: KEYS[2..4] holding another type than this
-- script writes (a string where the results stream is) would fail every
-- record and leave every entry pending; such a key is deleted first.
--
-- Returns { recorded, repaired }: recorded is 1 when this call recorded,
-- 0 when the marker was already set (a redelivered task finished a second
-- time: nothing is added); repaired names each key replaced,
-- { i, what, ... } (i the key's 1-based index, what it held).
local repaired = {}
local want = { nil, 'stream', 'string', 'string' }
for i = 2, 4 do
  local kind = redis.call('TYPE', KEYS[i]).ok
  if kind ~= 'none' and kind ~= want[i] then
    redis.call('DEL', KEYS[i])
    repaired[#repaired + 1] = i
    repaired[#repaired + 1] = 'a ' .. kind
  end
end
local recorded = 0
if redis.call('SET', KEYS[3], '1', 'NX', 'PX', tonumber(ARGV[3])) then
  local fields = {}
  for i = 5, #ARGV do
    fields[#fields + 1] = ARGV[i]
  end
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', tonumber(ARGV[4]), '*', unpack(fields))
  recorded = 1
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
redis.call('DEL', KEYS[4])
return { recorded, repaired }
