// The `arpo` command line: subcommands are registered here and load their
// implementation lazily, so `arpo --help` needs neither the native addon nor
// the datasets.
import { Command, InvalidArgumentError, Option } from 'commander';
import { ArpoError } from '../errors';
import { describeOptions, loadConfig } from '../train/config';

function collect(value: string, previous: string[]): string[] {
  return [...previous, value];
}

/** Adds the shared `--config` / `--set` options and the option table to a command's help. */
export function withConfigOptions(cmd: Command): Command {
  return cmd
    .option('-c, --config <file>', 'run configuration (JSON or YAML)')
    .addOption(new Option('-s, --set <key=value>', 'override one option (repeatable), e.g. --set rollout.budget=8').argParser(collect).default([]))
    .addHelpText('after', `\nOptions of the run configuration (path, default, meaning):\n${describeOptions()}\n`);
}

/** A finite number, or commander's error naming the text given. */
function numberArg(v: string): number {
  const x = Number(v);
  if (v.trim() === '' || !Number.isFinite(x)) throw new InvalidArgumentError(`expected a number, got ${JSON.stringify(v)}`);
  return x;
}

/** `--nproc N`: a number of local ranks. */
function nprocOption(): Option {
  return new Option('--nproc <n>', 'start n data-parallel ranks on this machine (as torchrun would) and forward their output with a rank prefix').argParser((v) => Number.parseInt(v, 10));
}

export function buildProgram(argv: readonly string[] = process.argv): Command {
  const program = new Command('arpo')
    .description('Train tool-using LLM agents with ARPO (Agentic Reinforced Policy Optimization)')
    .showHelpAfterError()
    .exitOverride();

  withConfigOptions(
    program.command('config').description('print the resolved run configuration (defaults + file + --set overrides) as JSON'),
  ).action((opts: { config?: string; set: string[] }) => {
    const cfg = loadConfig(opts.config ?? null, opts.set);
    process.stdout.write(`${JSON.stringify(cfg, null, 2)}\n`);
  });

  withConfigOptions(
    program.command('train').description('RL training (ARPO, GRPO, DAPO-style or REINFORCE++) as configured'),
  )
    .option('--resume', 'continue from the run directory\'s latest checkpoint')
    .addOption(nprocOption())
    .action(async (opts: { config?: string; set: string[]; resume?: boolean; nproc?: number }) => {
      if (opts.nproc !== undefined) return relaunch(opts.nproc, argv);
      const { train } = require('../train/trainer') as typeof import('../train/trainer');
      const cfg = loadConfig(opts.config ?? null, opts.set);
      const summary = await train(cfg, { resume: opts.resume === true });
      process.stdout.write(`${JSON.stringify({ runDir: summary.runDir, steps: summary.stepsDone, last: summary.lastMetrics })}\n`);
    });

  withConfigOptions(
    program.command('sft').description('supervised cold start on JSONL conversations with tool calls (tool results masked)'),
  )
    .requiredOption('-o, --out <dir>', 'where to save the fine-tuned model (HF directory)')
    .option('--resume', 'continue from the newest checkpoint in <train.outDir>/sft-checkpoints')
    .addOption(nprocOption())
    .action(async (opts: { config?: string; set: string[]; out: string; resume?: boolean; nproc?: number }) => {
      if (opts.nproc !== undefined) return relaunch(opts.nproc, argv);
      const { sft } = require('../train/sft') as typeof import('../train/sft');
      const cfg = loadConfig(opts.config ?? null, opts.set);
      const s = await sft(cfg, { out: opts.out, resume: opts.resume === true });
      process.stdout.write(`${JSON.stringify(s)}\n`);
    });

  withConfigOptions(
    program.command('eval').description('evaluation of a model on a dataset with the configured tools and reward: greedy (one sample per question), or --samples K at --temperature T (acc/mean is then pass@1 averaged over the samples, acc/pass@K the share of questions with a right sample)'),
  )
    .requiredOption('-m, --model <dir>', 'model directory')
    .requiredOption('-d, --data <file>', 'parquet or JSONL dataset')
    .option('-n, --limit <n>', 'evaluate at most n rows', (v) => Number.parseInt(v, 10), 0)
    .option('-o, --out <file>', 'write per-example results (JSONL, a row per sample)')
    .option('--samples <k>', 'samples per question (more than one needs --temperature > 0)', numberArg, 1)
    .option('--temperature <t>', 'sampling temperature (0 = greedy)', numberArg, 0)
    .action(async (opts: { config?: string; set: string[]; model: string; data: string; limit: number; out?: string; samples: number; temperature: number }) => {
      const { evaluate } = require('../train/evaluate') as typeof import('../train/evaluate');
      const cfg = loadConfig(opts.config ?? null, opts.set);
      const r = await evaluate(opts.model, opts.data, cfg, { limit: opts.limit, outFile: opts.out, samples: opts.samples, temperature: opts.temperature });
      process.stdout.write(`${JSON.stringify(r.metrics)}\n`);
    });

  program.addCommand((require('./init-model') as typeof import('./init-model')).initModelCommand());

  program
    .command('export')
    .description('write a trained model directory in another format: gguf (llama.cpp and the tools built on it)')
    .requiredOption('-m, --model <dir>', 'HF model directory (config.json, safetensors, tokenizer.json)')
    .requiredOption('-o, --out <file>', 'output file, e.g. model.gguf')
    .option('--format <format>', 'gguf', 'gguf')
    .option('--dtype <dtype>', 'f32, or f16 (matrices; norms and biases stay f32)', 'f32')
    .action((opts: { model: string; out: string; format: string; dtype: string }) => {
      if (opts.format !== 'gguf') throw new ArpoError('INVALID_ARGUMENT', `export: --format ${JSON.stringify(opts.format)}: expected gguf`);
      const { exportGguf } = require('../model/gguf') as typeof import('../model/gguf');
      const r = exportGguf(opts.model, opts.out, { dtype: opts.dtype as 'f32' | 'f16' });
      if (!r.textExact) {
        process.stderr.write(`export: the tokenizer's pre-tokenizer has no llama.cpp name; tagged "default" (GPT-2's split): token ids, vocabulary and merges are exact, text may split differently in llama.cpp\n`);
      }
      process.stdout.write(`${JSON.stringify(r)}\n`);
    });

  program
    .command('demo')
    .description('the embedded demo: a synthetic world, SFT of a tiny model, then ARPO RL that improves held-out accuracy (no downloads)')
    .option('-o, --out <dir>', 'output directory', 'runs/demo')
    .option('--seed <n>', 'seed of the world, model and run', (v) => Number.parseInt(v, 10), 1)
    .option('--steps <n>', 'RL steps (default 40; 3 with --quick)', (v) => Number.parseInt(v, 10))
    .option('--quick', 'a small, fast run (smoke test)')
    .option('--compare', 'also train trajectory-level GRPO from the same SFT checkpoint (same M, prompts, seed and steps) and report both side by side')
    .addOption(new Option('--nproc <n>', 'processes for pretraining, SFT and RL, data-parallel (default: 2 on a machine with 2 or more cores, else 1)').argParser((v) => Number.parseInt(v, 10)))
    .addOption(new Option('--model-rank <spec>', 'internal: a helper rank of the model stages').hideHelp())
    .action(async (opts: { out: string; seed: number; steps?: number; quick?: boolean; compare?: boolean; nproc?: number; modelRank?: string }) => {
      const { runDemo, runDemoModelRank } = require('./demo') as typeof import('./demo');
      if (opts.modelRank !== undefined) return runDemoModelRank(opts.modelRank);
      await runDemo({ out: opts.out, seed: opts.seed, steps: opts.steps, quick: opts.quick === true, compare: opts.compare === true, nproc: opts.nproc });
    });

  program
    .command('report')
    .description('write an HTML report (static SVG charts) of one run, or of several side by side')
    .argument('<run-dirs...>', 'run directories holding metrics.jsonl')
    .option('-o, --out <file>', 'output file (default: <first run>/report.html)')
    .action(async (dirs: string[], opts: { out?: string }) => {
      const { writeReport } = require('../train/report') as typeof import('../train/report');
      const file = await writeReport(dirs, opts.out);
      process.stdout.write(`${file}\n`);
    });

  return program;
}

/** `arpo <command> ... --nproc N`: the same command as N local ranks; a failed rank sets the exit code. */
async function relaunch(nproc: number, argv: readonly string[]): Promise<void> {
  const { launchLocalRanks, withoutNproc } = require('../train/launch') as typeof import('../train/launch');
  const code = await launchLocalRanks(nproc, withoutNproc(argv.slice(2)));
  if (code !== 0) process.exitCode = code;
}

/** Entry point used by bin/arpo.js; resolves to the process exit code. */
export async function main(argv: readonly string[]): Promise<number> {
  const program = buildProgram(argv);
  try {
    await program.parseAsync([...argv]);
  } catch (e) {
    const err = e as { code?: string; exitCode?: number };
    if (typeof err.code === 'string' && err.code.startsWith('commander.')) {
      return err.code === 'commander.helpDisplayed' || err.code === 'commander.version' ? 0 : (err.exitCode ?? 1);
    }
    throw e;
  }
  return typeof process.exitCode === 'number' ? process.exitCode : 0;
}
