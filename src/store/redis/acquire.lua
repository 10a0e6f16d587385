-- Takes a slot for ARGV[1] if the live holders plus the live waiters that
-- arrived before it are fewer than the limit; else queues it. Atomic, with
-- the server's clock.
-- KEYS: 1 holders (sorted set: permit -> expiry, Unix seconds), 2 queue
-- (sorted set: waiter -> ticket), 3 tickets (counter), 4 fence (counter),
-- 5 limit record, 6 alive (sorted set: waiter -> until when it is alive),
-- 7 epoch (hash: id, made with the keys; ttl and until, the longest TTL in
-- use lately), 8 lock delay (no slot is granted while it lives).
-- ARGV: 1 id, 2 limit, 3 ttl in ms, 4 base of per-contender keys,
-- 5 description (JSON), 6 "wait" or "try", 7 the epoch id the caller saw
-- last ('' at first), 8 the lock delay to set should the keys have been
-- lost (ms: the longest TTL the caller has seen in use).
-- 'acquired' and 'wait' answers end with the epoch id and the longest TTL
-- in use (ms); 'wait' answers carry the lock delay's milliseconds left (0
-- when none) before them.
local holders, queue, tickets, fence, limit_key, alive, epoch_key, lock_delay =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local id, limit, ttl, base, info, mode, seen, delay_if_lost =
  ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6], ARGV[7],
  tonumber(ARGV[8])
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
local epoch_kind = redis.call('TYPE', epoch_key).ok
if epoch_kind ~= 'hash' and epoch_kind ~= 'none' then
  return {'foreign', epoch_key, 'is a ' .. epoch_kind .. ', not the epoch consem keeps'}
end
local epoch = redis.call('HGET', epoch_key, 'id')
if not epoch then
  epoch = time[1] .. string.format('%06d', tonumber(time[2]))
  redis.call('HSET', epoch_key, 'id', epoch)
end
-- The longest TTL in use, kept for as long as a holder with it may live:
-- a lock delay must cover its lease too.
local longest = tonumber(redis.call('HGET', epoch_key, 'ttl') or '0')
if ttl >= longest or now > tonumber(redis.call('HGET', epoch_key, 'until') or '0') then
  longest = ttl
  redis.call('HSET', epoch_key, 'ttl', ttl, 'until', now + ttl / 1000)
end
if seen ~= '' and seen ~= epoch then
  -- The keys this caller saw are gone (FLUSHALL, an eviction, a restart
  -- without data), permits with them, while their holders may run on until
  -- they notice: no slot is granted until every lease granted before could
  -- have run out, as Consul's lock-delay does.
  if redis.call('PTTL', lock_delay) < delay_if_lost then
    redis.call('SET', lock_delay, epoch, 'PX', delay_if_lost)
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
    return {'conflict', 'has limit ' .. recorded}
  end
end
redis.call('SET', limit_key, limit)

local held_fence = redis.call('GET', base .. 'fence:' .. id)
if redis.call('ZSCORE', holders, id) and held_fence then
  -- An earlier call took the slot and its answer was lost: the permit is
  -- renewed, so that it lasts a TTL from this call, as the caller counts.
  redis.call('ZADD', holders, 'XX', now + ttl / 1000, id)
  redis.call('PEXPIRE', base .. 'fence:' .. id, ttl)
  return {'acquired', tonumber(held_fence), epoch, longest}
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
  -- At least the server's time in microseconds: a counter that is gone
  -- (a restart without persistence) or went back (a restart from an older
  -- snapshot, a failover to a replica that lagged) still hands out fences
  -- above every one before, as long as the server's clock does not go back.
  local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
  local taken = math.max(tonumber(redis.call('GET', fence) or '0') + 1, now_us)
  redis.call('SET', fence, string.format('%.0f', taken))
  redis.call('SET', base .. 'fence:' .. id, string.format('%.0f', taken), 'PX', ttl)
  -- The waiter now first in line may be served by the next departure.
  local next_waiter = redis.call('ZRANGE', queue, 0, 0)[1]
  if next_waiter then
    redis.call('LPUSH', base .. 'wake:' .. next_waiter, '1')
    redis.call('PEXPIRE', base .. 'wake:' .. next_waiter, ttl)
  end
  return {'acquired', taken, epoch, longest}
end
if mode == 'try' then
  redis.call('ZREM', queue, id)
  redis.call('ZREM', alive, id)
  redis.call('DEL', base .. 'info:' .. id)
  return {'full', held, ahead}
end
return {'wait', held, ahead, delay_left, epoch, longest}
