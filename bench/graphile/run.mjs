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
import { parseArgs } from "node:util";

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
