-- Takes ARGV[1] out of the holders and of the queue, removes its keys,
-- wakes the waiter first in line, and drops the limit record once nobody
-- holds or waits (the fence counter stays, so that fences keep growing).
-- KEYS: 1 holders, 2 queue, 3 limit record, 4 alive. ARGV: 1 id, 2 base.
-- The keys named from ARGV come first: while the prefix's slot migrates,
-- Redis refuses a script's first touch of a key it did not declare that
-- has left the node, and a script stopped there has then changed nothing
-- that counts (the permit stays, and expires).
local id, base = ARGV[1], ARGV[2]
redis.call('DEL', base .. 'info:' .. id, base .. 'fence:' .. id, base .. 'wake:' .. id)
for _, waiter in ipairs(redis.call('ZRANGE', KEYS[2], 0, 1)) do
  if waiter ~= id then
    redis.call('LPUSH', base .. 'wake:' .. waiter, '1')
    redis.call('PEXPIRE', base .. 'wake:' .. waiter, 60000)
    break
  end
end
redis.call('ZREM', KEYS[1], id)
redis.call('ZREM', KEYS[2], id)
redis.call('ZREM', KEYS[4], id)
if redis.call('ZCARD', KEYS[1]) == 0 and redis.call('ZCARD', KEYS[2]) == 0 then
  redis.call('DEL', KEYS[3])
end
return 1
