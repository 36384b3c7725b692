// The `arpo` command line: subcommands are registered here and load their
// implementation lazily, so `arpo --help` needs neither the native addon nor
// the datasets.
import { Command, Option } from 'commander';
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

export function buildProgram(): Command {
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

/** Entry point used by bin/arpo.js; resolves to the process exit code. */
export async function main(argv: readonly string[]): Promise<number> {
  const program = buildProgram();
  try {
    await program.parseAsync([...argv]);
  } catch (e) {
    const err = e as { code?: string; exitCode?: number };
    if (typeof err.code === 'string' && err.code.startsWith('commander.')) {
      return err.code === 'commander.helpDisplayed' || err.code === 'commander.version' ? 0 : (err.exitCode ?? 1);
    }
    throw e;
  }
  return 0;
}
