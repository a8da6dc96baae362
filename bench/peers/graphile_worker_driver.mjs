// Enqueue driver for graphile-worker (runs on its env's Node 22).
//
// One job per transaction: `WorkerUtils.addJob` (autocommit, on the utils' pool).
// Bulk: `WorkerUtils.addJobs` with the chunk's specs, one call (one `add_jobs`
// statement) per chunk. Many in one transaction: `addJob` cannot join a caller's
// transaction, so this is the SQL function it defers to, `graphile_worker.add_job`,
// called once per job on one client between BEGIN and COMMIT, as its documentation
// shows for adding jobs from application SQL
// (https://worker.graphile.org/docs/sql-add-job).

import { connectionString, importFromEnv, main } from "./driverlib.mjs";

const { makeWorkerUtils } = await importFromEnv("graphile-worker");
const pg = (await importFromEnv("pg")).default;

const ADD_JOB = {
  name: "bench_add_job",
  text: "SELECT graphile_worker.add_job($1, $2::json)",
};

let utils;
let client;

const noopSpecs = (count) => Array.from({ length: count }, () => ({ identifier: "noop", payload: {} }));

await main({
  async prepare() {
    utils = await makeWorkerUtils({ connectionString: connectionString() });
    await utils.withPgClient((pooled) => pooled.query("SELECT 1"));
    client = new pg.Client({ connectionString: connectionString() });
    await client.connect();
  },
  async close() {
    await utils?.release();
    await client?.end();
  },
  async enqueueEach(count) {
    for (let i = 0; i < count; i++) {
      await utils.addJob("noop", {});
    }
  },
  async enqueueInTransaction(count) {
    await client.query("BEGIN");
    for (let i = 0; i < count; i++) {
      await client.query({ ...ADD_JOB, values: ["noop", "{}"] });
    }
    await client.query("COMMIT");
  },
  async enqueueMany(count) {
    await utils.addJobs(noopSpecs(count));
  },
  async enqueueKeyed(key) {
    await utils.addJob("record_start", { key });
  },
  async enqueueMixed(items) {
    if (items.length === 1) {
      const [[key, seconds]] = items;
      await utils.addJob("mixed", { key, seconds });
    } else {
      await utils.addJobs(
        items.map(([key, seconds]) => ({ identifier: "mixed", payload: { key, seconds } })),
      );
    }
  },
});
