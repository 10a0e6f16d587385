-- Extends ARGV[1]'s permit by the TTL if it is still held. Answers {1,
-- epoch, longest TTL in use} while held, {0, ...} once the permit is gone,
-- {-1, ...} when the semaphore's keys were lost or went back since the
-- caller last saw them (another epoch; a fence counter below the caller's
-- fence: a restart from an older snapshot): then no slot is granted for
-- the lock delay (see acquire.lua).
-- KEYS: 1 holders, 2 epoch, 3 lock delay, 4 fence counter. ARGV: 1 id,
-- 2 ttl in ms, 3 base of per-contender keys, 4 the epoch id the caller saw
-- last, 5 the caller's fence, 6 the lock delay to set should the keys have
-- been lost (ms).
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local ttl = tonumber(ARGV[2])
local epoch = redis.call('HGET', KEYS[2], 'id')
local went_back = tonumber(redis.call('GET', KEYS[4]) or '0') < tonumber(ARGV[5])
local lost = epoch ~= ARGV[4] or went_back
if not epoch then
  epoch = time[1] .. string.format('%06d', tonumber(time[2]))
  redis.call('HSET', KEYS[2], 'id', epoch)
end
local longest = tonumber(redis.call('HGET', KEYS[2], 'ttl') or '0')
if ttl >= longest or now > tonumber(redis.call('HGET', KEYS[2], 'until') or '0') then
  longest = ttl
  redis.call('HSET', KEYS[2], 'ttl', ttl, 'until', now + ttl / 1000)
end
if lost and redis.call('PTTL', KEYS[3]) < tonumber(ARGV[6]) then
  redis.call('SET', KEYS[3], epoch, 'PX', ARGV[6])
end
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry or tonumber(expiry) <= now then
  redis.call('ZREM', KEYS[1], ARGV[1])
  if lost then return {-1, epoch, longest} end
  return {0, epoch, longest}
end
redis.call('ZADD', KEYS[1], 'XX', now + ttl / 1000, ARGV[1])
redis.call('PEXPIRE', ARGV[3] .. 'info:' .. ARGV[1], ttl)
redis.call('PEXPIRE', ARGV[3] .. 'fence:' .. ARGV[1], ttl)
return {1, epoch, longest}
