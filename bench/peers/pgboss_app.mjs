// pg-boss 12's schema and worker, for the harness (runs on its env's Node 22).
//
//     node pgboss_app.mjs setup          # create its schema and the benchmark's queues
//     node pgboss_app.mjs work           # one worker process, until SIGTERM
//     node pgboss_app.mjs work --drain   # one worker process, until no job is left
//
// One PgBoss instance per process, as its documentation starts one, with the options
// its worker documentation gives for a backlog of short jobs
// (https://timgit.github.io/pg-boss/api/workers): batchSize 1000 (one fetch and one
// completion statement per 1,000 jobs), localConcurrency 2 (two fetch loops in the
// process, so that one runs its batch while the other waits on the database), and
// burstWhenBatchFull (fetch again at once while fetches come back full, instead of
// waiting out the polling interval). The queues are created with `notify` and the
// instance with `useListenNotify`, its low-latency dispatch, so that an idle worker
// wakes on a new job as the other systems' do.
//
// pg-boss has no drain mode: `--drain` stops the instance (gracefully: its running
// batches finish and complete) once its workers hold no job and none of the queue's
// jobs is waiting, checked every 0.1 s with one indexed query.

import { connectionString, importFromEnv, INSERT_STARTED, sleep, wallClock } from "./driverlib.mjs";

const { PgBoss } = await importFromEnv("pg-boss");
const pg = (await importFromEnv("pg")).default;

export const QUEUES = ["noop", "record_start", "mixed"];
export const WORK_OPTIONS = { batchSize: 1000, localConcurrency: 2, burstWhenBatchFull: true };
const DRAIN_CHECK_SECONDS = 0.1;
// Waiting jobs of a queue: created or retry, the states a fetch claims (job_i11's predicate).
const WAITING_SQL =
  "SELECT EXISTS (SELECT 1 FROM pgboss.job WHERE name = $1 AND state < 'active' AND NOT blocked)";

function newBoss() {
  const boss = new PgBoss({ connectionString: connectionString(), useListenNotify: true });
  boss.on("error", (error) => console.error(`[error] ${error.stack ?? error}`));
  return boss;
}

async function setup() {
  const boss = newBoss();
  await boss.start();
  for (const name of QUEUES) {
    await boss.createQueue(name, { notify: true });
  }
  await boss.stop();
}

async function record(key) {
  const started = wallClock();
  await recorder.query(INSERT_STARTED, [key, started]);
}

// The probes' side table is written on a client of the script's own: the queue's
// pool is pg-boss's.
let recorder;

const handlers = {
  noop: async () => {},
  record_start: async (jobs) => {
    for (const job of jobs) {
      await record(job.data.key);
    }
  },
  // A batch's jobs run side by side: a long one does not hold up the short ones' start.
  mixed: async (jobs) => {
    await Promise.all(
      jobs.map(async (job) => {
        await record(job.data.key);
        if (job.data.seconds) {
          await sleep(job.data.seconds);
        }
      }),
    );
  },
};

async function work(drain) {
  recorder = new pg.Client({ connectionString: connectionString() });
  await recorder.connect();
  const boss = newBoss();
  await boss.start();
  for (const name of QUEUES) {
    await boss.work(name, WORK_OPTIONS, handlers[name]);
  }
  let stopping = null;
  const stop = () => {
    stopping ??= boss.stop({ graceful: true }).then(() => recorder.end());
    return stopping;
  };
  process.on("SIGTERM", () => stop().then(() => process.exit(0)));
  process.on("SIGINT", () => stop().then(() => process.exit(0)));
  if (!drain) {
    return;
  }
  for (;;) {
    await sleep(DRAIN_CHECK_SECONDS);
    const busy = boss.getWipData().some((worker) => worker.count > 0);
    if (busy) {
      continue;
    }
    const { rows } = await recorder.query(WAITING_SQL, ["noop"]);
    if (!rows[0].exists) {
      await stop();
      process.exit(0);
    }
  }
}

const [command, ...flags] = process.argv.slice(2);
if (command === "setup") {
  await setup();
} else if (command === "work") {
  await work(flags.includes("--drain"));
} else {
  throw new Error("usage: pgboss_app.mjs setup | work [--drain]");
}
