-- Takes a slot for ARGV[1] if the live holders plus the live waiters that
-- arrived before it are fewer than the limit; else queues it. Atomic, with
-- the server's clock.
-- KEYS: 1 holders (sorted set: permit -> expiry, Unix seconds), 2 queue
-- (sorted set: waiter -> ticket), 3 tickets (counter), 4 fence (counter),
-- 5 limit record, 6 alive (sorted set: waiter -> until when it is alive),
-- 7 epoch (when the semaphore's keys were made), 8 lock delay (no slot is
-- granted while it lives).
-- ARGV: 1 id, 2 limit, 3 ttl in ms, 4 base of per-contender keys,
-- 5 description (JSON), 6 "wait" or "try", 7 the epoch the caller saw
-- last ('' at first).
-- Answers end with the epoch, and 'wait' answers with the lock delay's
-- milliseconds left (0 when none).
local holders, queue, tickets, fence, limit_key, alive, epoch_key, lock_delay =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local id, limit, ttl, base, info, mode, seen =
  ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000

local kind = redis.call('TYPE', holders).ok
if kind ~= 'zset' and kind ~= 'none' then
  return {'foreign', holders, 'is a ' .. kind .. ', not a sorted set of permits'}
end
-- Permits whose expiry passed are gone, as every client of this layout has it.
redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
-- Waiters that stopped looking (dead, or stopped) are gone: each is
-- removed once, so that a call costs the same whatever the queue's length.
for _, waiter in ipairs(redis.call('ZRANGEBYSCORE', alive, '-inf', now)) do
  redis.call('ZREM', queue, waiter)
  redis.call('DEL', base .. 'info:' .. waiter, base .. 'wake:' .. waiter)
end
redis.call('ZREMRANGEBYSCORE', alive, '-inf', now)
local limit_kind = redis.call('TYPE', limit_key).ok
if limit_kind ~= 'string' and limit_kind ~= 'none' then
  return {'foreign', limit_key, 'is a ' .. limit_kind .. ', not a limit record'}
end
local epoch = redis.call('GET', epoch_key)
if not epoch then
  epoch = time[1] .. string.format('%06d', tonumber(time[2]))
  redis.call('SET', epoch_key, epoch)
end
if seen ~= '' and seen ~= epoch then
  -- The keys this caller saw are gone (FLUSHALL, an eviction, a restart
  -- without data), permits with them, while their holders may run on until
  -- they notice: no slot is granted until every lease granted before could
  -- have run out, as Consul's lock-delay does.
  if redis.call('PTTL', lock_delay) < ttl then
    redis.call('SET', lock_delay, epoch, 'PX', ttl)
  end
end
local recorded = redis.call('GET', limit_key)
if recorded and not tonumber(recorded) then
  return {'foreign', limit_key, 'holds ' .. string.sub(recorded, 1, 40) .. ', not a limit'}
end
if recorded and tonumber(recorded) ~= limit then
  local others = redis.call('ZCARD', holders) + redis.call('ZCARD', queue)
  if redis.call('ZSCORE', queue, id) then others = others - 1 end
  if others > 0 then
    return {'conflict', 'has limit ' .. recorded, epoch}
  end
end
redis.call('SET', limit_key, limit)

local held_fence = redis.call('GET', base .. 'fence:' .. id)
if redis.call('ZSCORE', holders, id) and held_fence then
  -- An earlier call took the slot and its answer was lost.
  return {'acquired', tonumber(held_fence), epoch}
end

local mine = redis.call('ZSCORE', queue, id)
if not mine then
  mine = redis.call('INCR', tickets)
  redis.call('ZADD', queue, mine, id)
end
redis.call('ZADD', alive, now + ttl / 1000, id)
redis.call('SET', base .. 'info:' .. id, info, 'PX', ttl)
local ahead = redis.call('ZCOUNT', queue, '-inf', '(' .. mine)
local held = redis.call('ZCARD', holders)
local delay_left = math.max(redis.call('PTTL', lock_delay), 0)
if held + ahead < limit and delay_left == 0 then
  redis.call('ZADD', holders, now + ttl / 1000, id)
  redis.call('ZREM', queue, id)
  redis.call('ZREM', alive, id)
  -- A counter that is gone (a server restarted without persistence)
  -- starts again at the server's time in microseconds, above every fence
  -- it handed out before, as long as its clock does not go back.
  if redis.call('EXISTS', fence) == 0 then
    redis.call('SET', fence, time[1] .. string.format('%06d', tonumber(time[2])))
  end
  local taken = redis.call('INCR', fence)
  redis.call('SET', base .. 'fence:' .. id, taken, 'PX', ttl)
  -- The waiter now first in line may be served by the next departure.
  local next_waiter = redis.call('ZRANGE', queue, 0, 0)[1]
  if next_waiter then
    redis.call('LPUSH', base .. 'wake:' .. next_waiter, '1')
    redis.call('PEXPIRE', base .. 'wake:' .. next_waiter, ttl)
  end
  return {'acquired', taken, epoch}
end
if mode == 'try' then
  redis.call('ZREM', queue, id)
  redis.call('ZREM', alive, id)
  redis.call('DEL', base .. 'info:' .. id)
  return {'full', held, ahead, epoch}
end
return {'wait', held, ahead, epoch, delay_left}
