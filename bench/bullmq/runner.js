// runner.js: the BullMQ side of the bench's cost mode (cost.go), run as its
// own Node process so that its CPU can be read from /proc. The bench
// installs the bullmq package next to this file at run time and speaks to
// it over stdout lines, as it does with its Go children:
//
//   node runner.js enq    <host:port> <n> <concurrent>  -> ready, start <ns>, end <ns> <n>
//   node runner.js worker <host:port> <n> <concurrency> -> ready, done <ns> <n> <dups>
//
// Each waits for its stdin to close before it exits, so that the bench can
// read its CPU while it is still alive. Everything is BullMQ's default but
// the worker's concurrency (50, as for the other systems) and a queue name.
'use strict';
const { Queue, Worker } = require('bullmq');

const [role, addr, nArg, cArg] = process.argv.slice(2);
const [host, port] = addr.split(':');
const connection = { host, port: Number(port) };
const n = Number(nArg);
const conc = Number(cArg);
const queueName = 'bench';

function now() { return process.hrtime.bigint() + offset; }
// hrtime is monotonic; the bench compares with the wall clock (Unix ns).
const offset = BigInt(Date.now()) * 1000000n - process.hrtime.bigint();

function untilStdinCloses() {
  return new Promise((resolve) => {
    process.stdin.on('end', resolve);
    process.stdin.on('close', resolve);
    process.stdin.resume();
  });
}

function payload(i) {
  // 64 bytes as the Go systems' payloads: kind, index, padding.
  return { k: 1, i, pad: 'x'.repeat(40) };
}

async function enq() {
  const q = new Queue(queueName, { connection });
  await q.waitUntilReady();
  console.log('ready');
  let next = 0;
  console.log('start ' + now());
  const loop = async () => {
    for (;;) {
      const i = next++;
      if (i >= n) return;
      await q.add('bench', payload(i));
    }
  };
  const loops = [];
  for (let c = 0; c < conc; c++) loops.push(loop());
  await Promise.all(loops);
  console.log('end ' + now() + ' ' + n);
  await untilStdinCloses();
  await q.close();
}

async function worker() {
  const seen = new Uint8Array(n);
  let got = 0, dups = 0, completed = 0, bad = 0;
  const w = new Worker(queueName, async (job) => {
    const i = job.data && job.data.i;
    if (typeof i !== 'number' || i < 0 || i >= n) { bad++; return; }
    if (seen[i]) { dups++; return; }
    seen[i] = 1;
    got++;
  }, { connection, concurrency: conc });
  w.on('completed', () => {
    completed++;
    if (completed === n) console.log('done ' + now() + ' ' + got + ' ' + (dups + bad));
  });
  w.on('error', (err) => { console.log('error ' + String(err).replace(/\n/g, ' ')); });
  await w.waitUntilReady();
  console.log('ready');
  await untilStdinCloses();
  await w.close();
}

const roles = { enq, worker };
if (!roles[role]) {
  console.log('error unknown role ' + role);
  process.exit(2);
}
roles[role]().then(() => process.exit(0), (err) => {
  console.log('error ' + String(err && err.stack || err).replace(/\n/g, ' '));
  process.exit(1);
});
