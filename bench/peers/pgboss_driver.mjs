// Enqueue driver for pg-boss (runs on its env's Node 22).
//
// One job per transaction: `send` (autocommit, on the instance's pool). Bulk:
// `insert` with the chunk's jobs, one call per chunk
// (https://timgit.github.io/pg-boss/api/jobs). Many in one transaction: `send` with
// its `db` option, pg-boss's way of running its statements inside the caller's
// transaction (https://timgit.github.io/pg-boss/api/adapters), here a pg client
// between BEGIN and COMMIT.

import { connectionString, importFromEnv, main } from "./driverlib.mjs";

const { PgBoss } = await importFromEnv("pg-boss");
const pg = (await importFromEnv("pg")).default;

let boss;
let client;
// pg-boss's `Db` interface over the application's own client.
const inTransaction = { executeSql: (text, values) => client.query(text, values) };

await main({
  async prepare() {
    // The constructor's defaults, as an application that enqueues would have them.
    boss = new PgBoss({ connectionString: connectionString() });
    boss.on("error", (error) => console.error(`[error] ${error.stack ?? error}`));
    await boss.start();
    client = new pg.Client({ connectionString: connectionString() });
    await client.connect();
  },
  async close() {
    await boss?.stop({ graceful: false });
    await client?.end();
  },
  async enqueueEach(count) {
    for (let i = 0; i < count; i++) {
      await boss.send("noop", {});
    }
  },
  async enqueueInTransaction(count) {
    await client.query("BEGIN");
    for (let i = 0; i < count; i++) {
      await boss.send("noop", {}, { db: inTransaction });
    }
    await client.query("COMMIT");
  },
  async enqueueMany(count) {
    await boss.insert("noop", Array.from({ length: count }, () => ({ data: {} })));
  },
  async enqueueKeyed(key) {
    await boss.send("record_start", { key });
  },
  async enqueueMixed(items) {
    if (items.length === 1) {
      const [[key, seconds]] = items;
      await boss.send("mixed", { key, seconds });
    } else {
      await boss.insert(
        "mixed",
        items.map(([key, seconds]) => ({ data: { key, seconds } })),
      );
    }
  },
});
