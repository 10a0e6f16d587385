-- Takes ARGV[1] out of the holders and of the queue, removes its keys,
-- wakes the waiter first in line, and drops the limit record once nobody
-- holds or waits (the fence counter stays, so that fences keep growing).
-- KEYS: 1 holders, 2 queue, 3 limit record, 4 alive. ARGV: 1 id, 2 base.
local id, base = ARGV[1], ARGV[2]
redis.call('ZREM', KEYS[1], id)
redis.call('ZREM', KEYS[2], id)
redis.call('ZREM', KEYS[4], id)
redis.call('DEL', base .. 'info:' .. id, base .. 'fence:' .. id, base .. 'wake:' .. id)
local first = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
if first then
  redis.call('LPUSH', base .. 'wake:' .. first, '1')
  redis.call('PEXPIRE', base .. 'wake:' .. first, 60000)
end
if redis.call('ZCARD', KEYS[1]) == 0 and redis.call('ZCARD', KEYS[2]) == 0 then
  redis.call('DEL', KEYS[3])
end
return 1
