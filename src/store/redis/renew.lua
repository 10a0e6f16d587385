-- Extends ARGV[1]'s permit by the TTL if it is still held ("renew"), or
-- only looks whether it is ("check"). Answers {1, epoch} while held, {0,
-- epoch} once the permit is gone, {-1, epoch} when the semaphore's keys
-- were lost since the caller last saw them (the epoch changed): then no
-- slot is granted for a TTL (see acquire.lua).
-- KEYS: 1 holders, 2 epoch, 3 lock delay. ARGV: 1 id, 2 ttl in ms, 3 base
-- of per-contender keys, 4 the epoch the caller saw last, 5 "renew" or
-- "check".
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local ttl = tonumber(ARGV[2])
local epoch = redis.call('GET', KEYS[2])
local lost = epoch ~= ARGV[4]
if lost then
  if not epoch then
    epoch = time[1] .. string.format('%06d', tonumber(time[2]))
    redis.call('SET', KEYS[2], epoch)
  end
  if redis.call('PTTL', KEYS[3]) < ttl then
    redis.call('SET', KEYS[3], epoch, 'PX', ttl)
  end
end
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry or tonumber(expiry) <= now then
  redis.call('ZREM', KEYS[1], ARGV[1])
  if lost then return {-1, epoch} end
  return {0, epoch}
end
if ARGV[5] == 'renew' then
  redis.call('ZADD', KEYS[1], 'XX', now + ttl / 1000, ARGV[1])
  redis.call('PEXPIRE', ARGV[3] .. 'info:' .. ARGV[1], ttl)
  redis.call('PEXPIRE', ARGV[3] .. 'fence:' .. ARGV[1], ttl)
end
return {1, epoch}
