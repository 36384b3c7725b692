// Loads the five ARPO RL datasets (load time each) and scores every ground
// truth against itself in a well-formed response, under arpo-deep-research
// (all rows) and math (math rows): a check of the data and of the rewards.
// Run: npx ts-node --transpile-only bench/datasets.ts [data dir]
import * as path from 'path';
import { PromptDataset } from '../lib/data';
import { deepResearchReward, mathReward } from '../lib/reward';

const DIR = process.argv[2] ?? '/work/shared/data/arpo';
const FILES = ['train_10k', 'valid', 'hard_search_1k', 'gaia_test', 'hle_test'];

/** `<think>…</think><answer>The final answer is \boxed{GT}</answer>`, the reference's answer form. */
const wellFormed = (gt: string) => `<think> I know this. </think>\n<answer> The final answer is \\[ \\boxed{${gt}} \\] </answer>`;

function histogram(scores: number[]): string {
  const bins: [string, (x: number) => boolean][] = [
    ['-1', (x) => x === -1],
    ['0', (x) => x === 0],
    ['(0,1)', (x) => x > 0 && x < 1],
    ['1', (x) => x === 1],
  ];
  const mean = scores.reduce((s, x) => s + x, 0) / Math.max(1, scores.length);
  return `${bins.map(([name, f]) => `${name}: ${scores.filter(f).length}`).join('  ')}  mean ${mean.toFixed(4)}`;
}

async function main(): Promise<void> {
  for (const name of FILES) {
    const file = path.join(DIR, `${name}.parquet`);
    // Three loads (read + decode + validate); min and median, as the machine is shared.
    const times: number[] = [];
    let ds: PromptDataset | undefined;
    for (let k = 0; k < 3; k++) {
      const t0 = process.hrtime.bigint();
      ds = await PromptDataset.load(file);
      times.push(Number(process.hrtime.bigint() - t0) / 1e6);
    }
    if (!ds) throw new Error('unreachable');
    times.sort((a, b) => a - b);
    console.log(`${name}: ${ds.size} rows (${ds.issues.length} skipped) loaded in ${(times[0] as number).toFixed(1)} ms min, ${(times[1] as number).toFixed(1)} ms median of 3`);
    for (const issue of ds.issues) console.log(`  skipped row ${issue.row}, ${issue.field}: ${issue.message}`);
    const deep = ds.examples.map((e) => deepResearchReward({ response: wellFormed(e.groundTruth as string), groundTruth: e.groundTruth }).score);
    console.log(`  arpo-deep-research (GT vs itself): ${histogram(deep)}`);
    const low = ds.examples.filter((_, i) => (deep[i] as number) < 1);
    for (const e of low.slice(0, 3)) console.log(`    < 1: ${JSON.stringify(e.groundTruth)} -> ${deepResearchReward({ response: wellFormed(e.groundTruth as string), groundTruth: e.groundTruth }).reason.slice(0, 80)}`);
    const withTools = ds.examples.map((e) => deepResearchReward({ response: wellFormed(e.groundTruth as string).replace('</think>', '</think><search>q</search><result>r</result><python>p</python><result>1</result>'), groundTruth: e.groundTruth }).score);
    console.log(`  arpo-deep-research, search + python used: ${withTools.filter((x) => Math.abs(x - 1.1) < 1e-12).length} of ${withTools.length} score 1.1`);
    const math = ds.examples.filter((e) => e.ability === 'math');
    if (math.length > 0) {
      const scores = math.map((e) => mathReward({ response: wellFormed(e.groundTruth as string), groundTruth: e.groundTruth }).score);
      console.log(`  math (math rows, GT vs itself):    ${histogram(scores)}`);
      for (const e of math.filter((_, i) => scores[i] !== 1).slice(0, 3)) console.log(`    < 1: ${JSON.stringify(e.groundTruth)}`);
    }
  }
}

main().catch((e: unknown) => {
  console.error(e);
  process.exitCode = 1;
});
