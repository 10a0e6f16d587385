"""The basic sorted-set semaphore most applications copy, as published
(Redis in Action, section 6.3's first version, with the expiry-scored layout
consem shares): expire old permits, count, add ours if there is room, else
sleep 100 ms and try again. Runs a command while holding a permit.

    python3 redis_semaphore.py <redis-url> <prefix> <limit> <command> [args...]
"""
import subprocess
import sys
import time
import uuid

import redis


def main():
    url, prefix, limit, command = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    client = redis.Redis.from_url(url)
    key = "semaphore:" + prefix
    permit = str(uuid.uuid4())
    timeout = 15.0
    while True:
        now = time.time()
        pipe = client.pipeline(transaction=True)
        pipe.zremrangebyscore(key, "-inf", now)
        pipe.zcard(key)
        _, held = pipe.execute()
        if held < limit:
            client.zadd(key, {permit: now + timeout})
            if client.zrank(key, permit) is not None and client.zcard(key) <= limit:
                break
            client.zrem(key, permit)
        time.sleep(0.1)
    try:
        return subprocess.call(command)
    finally:
        client.zrem(key, permit)


if __name__ == "__main__":
    sys.exit(main())
