// The command line of the Node peers' drivers: bench/driverlib.py's, in JavaScript.
//
// A Node peer's enqueue API is JavaScript, so its driver is too; the harness runs
// it exactly as it runs the Python drivers (same subcommands and options) and reads
// the same result line. Node's own modules only: each peer's packages come from its
// npm environment under bench/.envs/, found through BENCH_NODE_ENV (the scripts
// live here, outside that environment, so a bare `import "pg-boss"` would not
// resolve: `importFromEnv` resolves the name from the environment instead).

import { createRequire } from "node:module";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

export const RESULT_PREFIX = "BENCH-RESULT ";

/** A package of the peer's npm environment (BENCH_NODE_ENV), ES module or CommonJS. */
export async function importFromEnv(name) {
  const root = process.env.BENCH_NODE_ENV;
  if (!root) {
    throw new Error("BENCH_NODE_ENV is not set: run through bench/run.py");
  }
  const require = createRequire(join(root, "package.json"));
  return import(pathToFileURL(require.resolve(name)).href);
}

/** The benchmark database as a libpq URL, from the BENCH_DB_* variables run.py sets. */
export function connectionString() {
  const env = process.env;
  const user = encodeURIComponent(env.BENCH_DB_USER || "postgres");
  const password = env.BENCH_DB_PASSWORD ? `:${encodeURIComponent(env.BENCH_DB_PASSWORD)}` : "";
  const host = env.BENCH_DB_HOST || "127.0.0.1";
  const port = env.BENCH_DB_PORT || "5432";
  return `postgres://${user}${password}@${host}:${port}/${env.BENCH_DB_NAME}`;
}

/** Seconds since the epoch, as Python's time.time(): compared with the tasks' start times. */
export function wallClock() {
  return (performance.timeOrigin + performance.now()) / 1000;
}

export const sleep = (seconds) => new Promise((resolve) => setTimeout(resolve, seconds * 1000));

/** The latency probes' side table (bench/core/pg.py creates it). */
export const INSERT_STARTED = "INSERT INTO bench_started (key, started_at) VALUES ($1, $2)";

// -- the measurements, as in driverlib.py --------------------------------------------

async function timeSingle(driver, count) {
  const start = performance.now();
  await driver.enqueueEach(count);
  return (performance.now() - start) / 1000;
}

async function timeInTransaction(driver, count, chunk) {
  const start = performance.now();
  for (let remaining = count; remaining > 0; remaining -= chunk) {
    await driver.enqueueInTransaction(Math.min(chunk, remaining));
  }
  return (performance.now() - start) / 1000;
}

async function timeBulk(driver, count, chunk) {
  const start = performance.now();
  for (let remaining = count; remaining > 0; remaining -= chunk) {
    await driver.enqueueMany(Math.min(chunk, remaining));
  }
  return (performance.now() - start) / 1000;
}

async function enqueueForLatency(driver, firstKey, count, pause) {
  const enqueued = {};
  for (let key = firstKey; key < firstKey + count; key++) {
    enqueued[key] = wallClock();
    await driver.enqueueKeyed(key);
    await sleep(pause);
  }
  return enqueued;
}

/** Task `i` sleeps `longSeconds` when `i % longEvery == longEvery / 2`; calls on a timetable. */
async function enqueueMixedLoad(driver, { firstKey, count, rate, burst, longEvery, longSeconds }) {
  const enqueued = {};
  const longKeys = [];
  const interval = burst / rate;
  const start = performance.now();
  for (let call = 0, first = 0; first < count; call++, first += burst) {
    const delay = (start + call * interval * 1000 - performance.now()) / 1000;
    if (delay > 0) {
      await sleep(delay);
    }
    const items = [];
    for (let index = first; index < Math.min(first + burst, count); index++) {
      const key = firstKey + index;
      const seconds = index % longEvery === Math.floor(longEvery / 2) ? longSeconds : 0;
      if (seconds) {
        longKeys.push(key);
      }
      items.push([key, seconds]);
    }
    const at = wallClock();
    await driver.enqueueMixed(items);
    for (const [key] of items) {
      enqueued[key] = at;
    }
  }
  return { enqueued, long_keys: longKeys, seconds: (performance.now() - start) / 1000 };
}

// -- the command line ----------------------------------------------------------------

const OPTIONS = {
  enqueue: { mode: String, count: Number, chunk: Number },
  latency: { "first-key": Number, count: Number, pause: Number },
  mixed: {
    "first-key": Number,
    count: Number,
    rate: Number,
    burst: Number,
    "long-every": Number,
    "long-seconds": Number,
  },
};
const DEFAULTS = {
  enqueue: { chunk: 1000 },
  latency: { pause: 0.02 },
  mixed: { burst: 1, "long-every": 100, "long-seconds": 2 },
};

function parse(argv) {
  const [command, ...rest] = argv;
  const known = OPTIONS[command];
  if (!known) {
    throw new Error(`usage: driver {enqueue,latency,mixed} --option value ...; got ${command}`);
  }
  const options = { ...DEFAULTS[command] };
  for (let i = 0; i < rest.length; i += 2) {
    const name = rest[i].replace(/^--/, "");
    if (!(name in known) || i + 1 >= rest.length) {
      throw new Error(`${command}: unknown or incomplete option ${rest[i]}`);
    }
    options[name] = known[name](rest[i + 1]);
  }
  for (const name of Object.keys(known)) {
    if (options[name] === undefined || Number.isNaN(options[name])) {
      throw new Error(`${command}: --${name} is required`);
    }
  }
  if (command === "enqueue" && !["single", "transaction", "bulk"].includes(options.mode)) {
    throw new Error(`enqueue: --mode is single, transaction or bulk, not ${options.mode}`);
  }
  return { command, options };
}

/**
 * Run one driver command and print its result line.
 *
 * `driver`: prepare(), close(), enqueueEach(count) (one per transaction),
 * enqueueInTransaction(count) (the one-task call `count` times in one transaction),
 * enqueueMany(count) (one bulk call), enqueueKeyed(key), enqueueMixed([[key, seconds]]).
 */
export async function main(driver, argv = process.argv.slice(2)) {
  const { command, options } = parse(argv);
  await driver.prepare();
  let result;
  try {
    if (command === "enqueue") {
      const cpu = process.cpuUsage();
      let seconds;
      if (options.mode === "single") {
        seconds = await timeSingle(driver, options.count);
      } else if (options.mode === "transaction") {
        seconds = await timeInTransaction(driver, options.count, options.chunk);
      } else {
        seconds = await timeBulk(driver, options.count, options.chunk);
      }
      // The driver's own CPU (client library and encoding), beside the wall time.
      const used = process.cpuUsage(cpu);
      result = { count: options.count, seconds, cpu_seconds: (used.user + used.system) / 1e6 };
    } else if (command === "latency") {
      result = {
        enqueued: await enqueueForLatency(driver, options["first-key"], options.count, options.pause),
      };
    } else {
      result = await enqueueMixedLoad(driver, {
        firstKey: options["first-key"],
        count: options.count,
        rate: options.rate,
        burst: options.burst,
        longEvery: options["long-every"],
        longSeconds: options["long-seconds"],
      });
    }
  } finally {
    await driver.close();
  }
  process.stdout.write(RESULT_PREFIX + JSON.stringify(result) + "\n");
}
