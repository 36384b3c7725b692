// Long fuzzing: the targets of test/fuzz (the suite runs 1000 seeded cases of
// each), round-robin for as long as asked, from a fresh seed unless given.
//   npm run fuzz -- [--minutes N] [--seed S] [--only <substring of a target name>]
// A failure prints its seed and case; replay it with
//   ARPO_FUZZ_SEED=S npx jest test/fuzz   (or --seed S, the case index is printed).
import * as fs from 'fs';
import { fuzzDir, makeTargets } from '../test/fuzz/targets';

function arg(name: string): string | undefined {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : undefined;
}

async function main(): Promise<number> {
  const minutes = Number(arg('minutes') ?? 5);
  if (!(minutes > 0)) throw new Error(`Expected a positive number for --minutes but received ${JSON.stringify(arg('minutes'))}`);
  const seed = arg('seed') !== undefined ? Number(arg('seed')) : (Date.now() % 2 ** 31) >>> 0;
  if (!Number.isInteger(seed)) throw new Error(`Expected an integer for --seed but received ${JSON.stringify(arg('seed'))}`);
  const only = arg('only');
  const dir = fuzzDir();
  try {
    const matching = makeTargets(dir).filter((t) => only === undefined || t.name.includes(only));
    for (const t of matching) if (t.skip !== undefined) process.stdout.write(`fuzz: ${t.name} skipped: ${t.skip}\n`);
    const targets = matching.filter((t) => t.skip === undefined);
    if (targets.length === 0) throw new Error(`no fuzz target matches --only ${JSON.stringify(only)}`);
    const stats = targets.map(() => ({ ok: 0, rejected: 0, failed: 0, ms: 0 }));
    const deadline = Date.now() + minutes * 60000;
    let index = 0;
    let failures = 0;
    process.stdout.write(`fuzz: seed ${seed}, ${minutes} min, ${targets.length} targets\n`);
    while (Date.now() < deadline) {
      for (let t = 0; t < targets.length; t++) {
        const target = targets[t]!;
        const s = stats[t]!;
        const t0 = performance.now();
        try {
          s[await target.run(seed, index)]++;
        } catch (e) {
          s.failed++;
          failures++;
          process.stdout.write(`FAIL ${target.name}: seed ${seed} case ${index}: ${(e as Error).message}\n`);
        }
        s.ms += performance.now() - t0;
      }
      index++;
    }
    for (let t = 0; t < targets.length; t++) {
      const s = stats[t]!;
      process.stdout.write(`${targets[t]!.name}: ${index} cases, ${s.ok} ok, ${s.rejected} rejected cleanly, ${s.failed} failed, ${(s.ms / index).toFixed(2)} ms / case\n`);
    }
    return failures === 0 ? 0 : 1;
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

main().then((code) => process.exit(code), (e) => {
  process.stderr.write(`${(e as Error).message}\n`);
  process.exit(2);
});
