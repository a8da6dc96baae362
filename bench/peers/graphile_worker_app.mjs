// graphile-worker 0.18's schema and worker, for the harness (runs on its env's Node 22).
//
//     node graphile_worker_app.mjs setup          # install its schema (runMigrations)
//     node graphile_worker_app.mjs work           # one worker process, until SIGTERM
//     node graphile_worker_app.mjs work --drain   # one worker process, until no job is left
//
// Configured with the preset of its performance page
// (https://worker.graphile.org/docs/performance): concurrentJobs 24, maxPoolSize 25,
// localQueue of 500 and job completions batched with no delay. `--drain` is its own
// run-once mode (the CLI's `--once`, the library's `runOnce`): the pool exits once no
// job is runnable. Successful jobs are not logged (NO_LOG_SUCCESS, which its own
// performance test sets) and the logger prints warnings and errors only, as every
// system in the benchmark logs.

import { connectionString, importFromEnv, INSERT_STARTED, sleep, wallClock } from "./driverlib.mjs";

const { Logger, run, runMigrations, runOnce } = await importFromEnv("graphile-worker");

export const CONCURRENT_JOBS = 24;

const quietLogger = new Logger((scope) => (level, message) => {
  if (level === "error" || level === "warning") {
    console.error(`[${level}] ${scope.label ?? "worker"}: ${message}`);
  }
});

export const preset = {
  worker: {
    connectionString: connectionString(),
    concurrentJobs: CONCURRENT_JOBS,
    maxPoolSize: CONCURRENT_JOBS + 1,
    localQueue: { size: 500 },
    completeJobBatchDelay: 0,
    failJobBatchDelay: 0,
    logger: quietLogger,
  },
};

async function record(helpers, key) {
  const started = wallClock();
  await helpers.withPgClient((client) => client.query(INSERT_STARTED, [key, started]));
}

const taskList = {
  // The drain benchmark's task: the queue's own cost is all there is.
  noop: async () => {},
  // Latency probe: write when it started, for the harness to compare.
  record_start: async (payload, helpers) => {
    await record(helpers, payload.key);
  },
  // Mixed load: record the start, then sleep 0 or a few seconds (not holding the loop).
  mixed: async (payload, helpers) => {
    await record(helpers, payload.key);
    if (payload.seconds) {
      await sleep(payload.seconds);
    }
  },
};

async function main(argv) {
  const [command, ...flags] = argv;
  if (command === "setup") {
    await runMigrations({ preset });
  } else if (command === "work" && flags.includes("--drain")) {
    await runOnce({ preset, taskList });
  } else if (command === "work") {
    // Its own signal handling: SIGTERM shuts the pool down gracefully.
    const runner = await run({ preset, taskList });
    await runner.promise;
  } else {
    throw new Error("usage: graphile_worker_app.mjs setup | work [--drain]");
  }
}

await main(process.argv.slice(2));
