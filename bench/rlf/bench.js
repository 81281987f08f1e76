// rate-limiter-flexible (RateLimiterRedis: fixed window) on one ioredis connection:
// W1 = `keys` keys uniformly at random (seeded), `points`/min each, `decisions` consume()
// calls, `concurrency` in flight. Prints one JSON line.
const Redis = require('ioredis');
const { RateLimiterRedis } = require('rate-limiter-flexible');

const [port, keys, decisions, concurrency, points] = process.argv.slice(2).map(Number);
// mulberry32, fixed seed
let s = 42;
const rnd = () => { s |= 0; s = (s + 0x6d2b79f5) | 0; let t = Math.imul(s ^ (s >>> 15), 1 | s);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t; return ((t ^ (t >>> 14)) >>> 0) / 4294967296; };
const seq = Array.from({ length: decisions }, () => 'k' + Math.floor(rnd() * keys));

async function main() {
  const redis = new Redis({ host: '127.0.0.1', port, enableOfflineQueue: true });
  await redis.ping();
  const limiter = new RateLimiterRedis({ storeClient: redis, keyPrefix: 'rlf', points, duration: 60 });
  // warm-up (loads the script), other keys
  for (let i = 0; i < 200; i++) await limiter.consume('warm' + i).catch(() => {});
  await redis.call('CONFIG', 'RESETSTAT');
  const lat = new Float64Array(decisions);
  let next = 0, accepted = 0, errors = 0;
  const t0 = process.hrtime.bigint();
  async function worker() {
    while (true) {
      const i = next++;
      if (i >= decisions) return;
      const t = process.hrtime.bigint();
      try { await limiter.consume(seq[i]); accepted++; }
      catch (e) { if (e instanceof Error) errors++; }
      lat[i] = Number(process.hrtime.bigint() - t) / 1000;
    }
  }
  await Promise.all(Array.from({ length: concurrency }, worker));
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  const info = await redis.call('INFO', 'commandstats');
  lat.sort();
  const q = (p) => lat[Math.min(decisions - 1, Math.floor(p * decisions))];
  console.log(JSON.stringify({ decisions, seconds, accepted, errors, p50_us: q(0.5), p99_us: q(0.99), p999_us: q(0.999), commandstats: info }));
  redis.disconnect();
}
main().catch((e) => { console.error(e); process.exit(1); });
