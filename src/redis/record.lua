-- Records the one result (or dead letter) of a stream entry, acknowledges
-- and deletes the entry, all at once.
--
-- KEYS[1] the task stream, KEYS[2] the stream to add to (results or dead),
-- KEYS[3] the entry's done-marker, KEYS[4] the entry's last-error key.
-- ARGV[1] the consumer group, ARGV[2] the entry id, ARGV[3] the marker's
-- TTL (ms), ARGV[4..] field/value pairs of the entry to add.
--
-- Returns 1 when this call recorded, 0 when the marker was already set (a
-- redelivered task finished a second time: nothing is added).
local recorded = 0
if redis.call('SET', KEYS[3], '1', 'NX', 'PX', tonumber(ARGV[3])) then
  local fields = {}
  for i = 4, #ARGV do
    fields[#fields + 1] = ARGV[i]
  end
  redis.call('XADD', KEYS[2], '*', unpack(fields))
  recorded = 1
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
redis.call('DEL', KEYS[4])
return recorded
