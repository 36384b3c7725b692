// Loads the native addon: the full one (kernels + libtorch model) built by
// cmake-js, else the kernels-only one built by node-gyp, else one error that
// says how to fix it.
import * as fs from 'fs';
import * as path from 'path';
import type { NativeAddon } from './types';

/** Directory holding arpo's package.json (works from lib/ and dist/lib/). */
export function packageRoot(): string {
  let dir = __dirname;
  for (let i = 0; i < 6; i++) {
    const pj = path.join(dir, 'package.json');
    if (fs.existsSync(pj)) {
      try {
        if ((JSON.parse(fs.readFileSync(pj, 'utf8')) as { name?: string }).name === 'arpo') return dir;
      } catch {
        /* keep walking */
      }
    }
    dir = path.dirname(dir);
  }
  return path.resolve(__dirname, '..', '..');
}

export class NativeLoadError extends Error {
  readonly code = 'NATIVE_NOT_BUILT';
  constructor(message: string) {
    super(message);
    this.name = 'NativeLoadError';
  }
}

let cached: NativeAddon | undefined;

/** The loaded addon (cached). `ARPO_ADDON=/path/to/x.node` overrides the search. */
export function loadNative(): NativeAddon {
  if (cached) return cached;
  // OpenBLAS (the BLAS of Debian's libtorch) keeps an idle worker spinning on
  // sched_yield for ~0.1 s after every matmul. Between the engine's many small
  // matmuls that spin held a core the attention kernel's other thread needed
  // (perf of a 64-row decode call: ~40% of the samples in the spinner). A short
  // timeout makes idle workers sleep at once. OpenBLAS reads it when the addon
  // loads it; a value the user set is kept.
  if (process.env.OPENBLAS_THREAD_TIMEOUT === undefined) process.env.OPENBLAS_THREAD_TIMEOUT = '4';
  const root = packageRoot();
  const tried: string[] = [];
  const candidates: string[] = [];
  if (process.env.ARPO_ADDON) candidates.push(path.resolve(process.env.ARPO_ADDON));
  candidates.push(path.join(root, 'build-cmake', 'Release', 'arpo.node'));
  for (const file of candidates) {
    if (!fs.existsSync(file)) {
      tried.push(`${file}: not found`);
      continue;
    }
    try {
      cached = require(file) as NativeAddon;
      return cached;
    } catch (e) {
      tried.push(`${file}: ${(e as Error).message.split('\n')[0]}`);
    }
  }
  try {
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    const nodeGypBuild = require('node-gyp-build') as (dir: string) => unknown;
    cached = nodeGypBuild(root) as NativeAddon;
    return cached;
  } catch (e) {
    tried.push(`node-gyp-build(${root}): ${(e as Error).message.split('\n')[0]}`);
  }
  throw new NativeLoadError(
    [
      'The arpo native addon is not built (neither the full cmake-js addon nor the kernels-only node-gyp one loads).',
      ...tried.map((t) => `  tried ${t}`),
      'To fix it:',
      '  sudo bash scripts/install-deps.sh   # compilers, cmake, libtorch (Debian/Ubuntu)',
      '  npm run build:native                # or ARPO_KERNELS_ONLY=1 npm run build:native without libtorch',
    ].join('\n'),
  );
}

/** True when the loaded addon has the libtorch model layer. */
export function hasTorch(): boolean {
  return loadNative().hasTorch === true;
}
