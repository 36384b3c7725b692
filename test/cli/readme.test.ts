// README.md's "Using it" commands, run as written and in order from a copy of
// the repository's layout (every top-level entry linked, models/ and runs/
// fresh, ../shared the real shared data), each checked for what it promises.
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { readMetrics } from '../../lib/train/metrics';
import { readTreeViews } from '../../lib/train/tree-view';

const root = path.resolve(__dirname, '..', '..');

/** The first sh block after "## Using it": one command per line, trailing comments dropped. */
function readmeCommands(readme: string): string[][] {
  const at = readme.indexOf('\n## Using it\n');
  if (at < 0) throw new Error('README.md has no "## Using it" section');
  const open = readme.indexOf('```sh\n', at);
  const close = readme.indexOf('\n```', open + 6);
  if (open < 0 || close < 0) throw new Error('README.md "Using it" has no sh block');
  return readme
    .slice(open + 6, close)
    .split('\n')
    .map((l) => l.replace(/\s+#.*$/, '').trim())
    .filter((l) => l.length > 0)
    .map((l) => {
      if (/["'`$|&;<>\\]/.test(l)) throw new Error(`README command needs a shell, which this test does not run: ${l}`);
      return l.split(/\s+/);
    });
}

const commands = readmeCommands(fs.readFileSync(path.join(root, 'README.md'), 'utf8'));
let work: string;
let tmp: string;

beforeAll(() => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-readme-'));
  work = path.join(tmp, 'repo');
  fs.mkdirSync(work);
  for (const e of fs.readdirSync(root)) if (e !== 'models' && e !== 'runs' && e !== '.git') fs.symlinkSync(path.join(root, e), path.join(work, e));
  fs.symlinkSync(path.resolve(root, '..', 'shared'), path.join(tmp, 'shared'));
});
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

function run(argv: string[]): { out: string; err: string } {
  expect(argv[0]).toBe('node');
  const r = spawnSync(process.execPath, argv.slice(1), { cwd: work, encoding: 'utf8', timeout: 240_000 });
  if (r.status !== 0) throw new Error(`${argv.join(' ')}: exit ${r.status} ${r.signal ?? ''}\n${r.stderr}`);
  return { out: r.stdout, err: r.stderr };
}

const lastJson = (s: string): Record<string, unknown> => JSON.parse(s.trim().split('\n').pop()!) as Record<string, unknown>;
const at = (p: string): string => path.join(work, p);

/** What each command promises, by its subcommand and a distinguishing argument. */
const checks: { match: (a: string[]) => boolean; check: (r: { out: string; err: string }) => void }[] = [
  {
    match: (a) => a[2] === 'init-model',
    check: () => {
      const cfg = JSON.parse(fs.readFileSync(at('models/tiny/config.json'), 'utf8')) as Record<string, number>;
      expect(cfg.vocab_size).toBeGreaterThanOrEqual(256);
      expect(fs.existsSync(at('models/tiny/tokenizer.json'))).toBe(true);
    },
  },
  {
    match: (a) => a[2] === 'sft',
    check: ({ out }) => {
      const s = lastJson(out) as { steps: number; firstLoss: number; lastLoss: number };
      expect(s.steps).toBeGreaterThan(0);
      expect(s.lastLoss).toBeLessThan(s.firstLoss);
      expect(fs.existsSync(at('models/tiny-sft/model.safetensors'))).toBe(true);
    },
  },
  {
    match: (a) => a[2] === 'train' && a.length === 5,
    check: ({ err }) => {
      const recs = readMetrics(at('runs/tiny-arpo/metrics.jsonl'));
      expect(recs.filter((r) => r.phase === 'train').map((r) => r.step)).toEqual([1, 2]);
      expect(recs.filter((r) => r.phase === 'valid').map((r) => r.step)).toEqual([0, 2]);
      expect(err).toMatch(/python sandbox: isolation=/);
      const trees = readTreeViews(at('runs/tiny-arpo'));
      expect(trees && !('error' in trees) && trees.trees.length).toBeGreaterThan(0);
    },
  },
  {
    match: (a) => a.includes('--resume'),
    check: ({ out, err }) => {
      expect(err).toContain('already at step 2 of 2, nothing to do');
      expect(lastJson(out)).toMatchObject({ steps: 0 });
      expect(readMetrics(at('runs/tiny-arpo/metrics.jsonl')).filter((r) => r.phase === 'train')).toHaveLength(2);
    },
  },
  {
    match: (a) => a.includes('algorithm.name=grpo'),
    check: () => {
      expect(readMetrics(at('runs/tiny-grpo/metrics.jsonl')).filter((r) => r.phase === 'train')).toHaveLength(2);
      expect(JSON.parse(fs.readFileSync(at('runs/tiny-grpo/config.json'), 'utf8')).algorithm.name).toBe('grpo');
    },
  },
  {
    match: (a) => a[2] === 'eval' && !a.includes('--samples'),
    check: ({ out }) => expect(lastJson(out)).toMatchObject({ 'valid/examples': 4, 'reward/mean': expect.any(Number) }),
  },
  {
    match: (a) => a[2] === 'eval' && a.includes('--samples'),
    check: ({ out }) => {
      const m = lastJson(out);
      expect(m).toMatchObject({ 'valid/examples': 4, 'valid/samples': 4, 'valid/temperature': 1, 'acc/mean': expect.any(Number), 'acc/pass@4': expect.any(Number) });
      expect(m['acc/pass@4'] as number).toBeGreaterThanOrEqual(m['acc/mean'] as number);
    },
  },
  {
    match: (a) => a[2] === 'report',
    check: ({ out }) => {
      expect(out.trim()).toBe('runs/tiny-arpo/report.html');
      const html = fs.readFileSync(at('runs/tiny-arpo/report.html'), 'utf8');
      expect(html).toContain('<th>tiny-arpo</th><th>tiny-grpo</th>');
      expect(html).toContain('<section id="trees">');
    },
  },
  {
    match: (a) => a[2] === 'export',
    check: () => expect(fs.readFileSync(at('models/tiny-sft.gguf')).subarray(0, 4).toString('latin1')).toBe('GGUF'),
  },
  {
    match: (a) => a.includes('--help'),
    check: ({ out }) => {
      expect(out).toContain('train.reportTrees');
      expect(out).toContain('rollout.budget');
    },
  },
];

test('the README block is the sequence this test knows', () => {
  expect(commands.map((a) => checks.findIndex((c) => c.match(a)))).toEqual(checks.map((_, i) => i));
});

for (const [i, argv] of commands.entries()) {
  test(`README command ${i + 1}: ${argv.slice(2).join(' ')}`, () => {
    const check = checks.find((c) => c.match(argv));
    if (!check) throw new Error(`no check for README command: ${argv.join(' ')}`);
    check.check(run(argv));
  }, 300_000);
}

test('examples/qwen2.5-7b.yaml is a valid run configuration with the reference scripts\' settings (ARPO.md)', () => {
  const { loadConfig } = require('../../lib/train/config') as typeof import('../../lib/train/config');
  const c = loadConfig(path.join(root, 'examples', 'qwen2.5-7b.yaml'));
  expect(c.model).toMatchObject({ dtype: 'bfloat16', device: 'cuda' });
  expect(c.rollout).toMatchObject({ mode: 'arpo', budget: 16, initialSamples: 8, maxResponseTokens: 4096 });
  expect(c.train).toMatchObject({ batchPrompts: 128, miniBatchPrompts: 16, ppoEpochs: 2 });
  expect(c.optim.lr).toBe(1e-6);
  expect(c.loss.klCoef).toBe(0);
});
