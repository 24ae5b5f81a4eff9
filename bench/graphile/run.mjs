// Graphile Worker, for trioworker's end-to-end comparison (bench/peer_graphile.py).
//
//   node run.mjs install --url URL
//   node run.mjs worker --url URL --concurrency C [--local-queue N] [--batch-delay MS]
//
// `install` creates or migrates the graphile_worker schema, as `graphile-worker
// --schema-only` does. `worker` runs one Worker pool with a no-op task "noop" until
// SIGTERM (Graphile's own handler shuts it down gracefully). Without --local-queue and
// --batch-delay every option is Graphile's default but concurrentJobs (and maxPoolSize
// once that needs more than its default 10); with them, the batching of its performance
// docs: jobs fetched N at a time into a local queue, and completions (and failures)
// written together after MS milliseconds.
//
// A worker counts its claims (getJobs' statement: an UPDATE of _private_jobs setting
// locked_by, and the jobs it returned) and finishes (completeJobs' DELETEs of
// _private_jobs, and their jobs), and prints the counts so far as a `bench-counts
// {...}` line on SIGWINCH (bench/statements.py reads them).
import { parseArgs } from "node:util";
import pg from "pg";

const counts = { claims: 0, claimed: 0, finishes: 0, finished: 0 };
const query = pg.Client.prototype.query;
pg.Client.prototype.query = function (config, ...rest) {
  const text = typeof config === "string" ? config : config?.text ?? "";
  const result = query.call(this, config, ...rest);
  if (text.includes("_private_jobs as jobs") && text.includes("locked_by = $1::text")) {
    counts.claims += 1;
    result?.then?.((r) => { counts.claimed += r?.rows?.length ?? 0; }, () => {});
  } else if (text.includes("delete from") && text.includes("_private_jobs")) {
    counts.finishes += 1;
    const first = config?.values?.[0];
    counts.finished += Array.isArray(first) ? first.length : 1;
  }
  return result;
};
process.on("SIGWINCH", () => {
  process.stdout.write(`bench-counts ${JSON.stringify(counts)}\n`);
});

// No log line per job, like the other systems: graphile-worker reads NO_LOG_SUCCESS
// (as its own test script sets it) when it loads, so it is imported after this.
process.env.NO_LOG_SUCCESS = "1";
const { run, runMigrations } = await import("graphile-worker");

const { positionals, values } = parseArgs({
  allowPositionals: true,
  options: {
    url: { type: "string" },
    concurrency: { type: "string", default: "1" },
    "local-queue": { type: "string" },
    "batch-delay": { type: "string" },
  },
});
const [command] = positionals;
const connectionString = values.url;

if (command === "install") {
  await runMigrations({ connectionString });
} else if (command === "worker") {
  const concurrentJobs = Number(values.concurrency);
  const worker = {
    concurrentJobs,
    // "10 or concurrentJobs + 2, whichever is larger" (its maxPoolSize docs).
    maxPoolSize: Math.max(10, concurrentJobs + 2),
  };
  if (values["local-queue"] !== undefined) {
    worker.localQueue = { size: Number(values["local-queue"]) };
  }
  if (values["batch-delay"] !== undefined) {
    worker.completeJobBatchDelay = Number(values["batch-delay"]);
    worker.failJobBatchDelay = Number(values["batch-delay"]);
  }
  const runner = await run({
    connectionString,
    preset: { worker },
    parsedCronItems: [], // no crontab file to look for
    taskList: {
      // Nothing, like the trioworker bench handler.
      noop: async () => {},
    },
  });
  await runner.promise;
} else {
  console.error(`usage: node run.mjs install|worker --url URL [options]; got ${command}`);
  process.exit(2);
}
