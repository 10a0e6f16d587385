-- Extends ARGV[1]'s permit by the TTL if it is still held; 0 if it is gone.
-- KEYS: 1 holders. ARGV: 1 id, 2 ttl in ms, 3 base of per-contender keys.
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry or tonumber(expiry) <= now then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]) / 1000, ARGV[1])
redis.call('PEXPIRE', ARGV[3] .. 'info:' .. ARGV[1], ARGV[2])
redis.call('PEXPIRE', ARGV[3] .. 'fence:' .. ARGV[1], ARGV[2])
return 1
