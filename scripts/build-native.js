#!/usr/bin/env node
// Builds the native addon at `npm install`: the full addon (kernels + libtorch
// model, + CUDA when nvcc is found) through cmake-js into build-cmake/, else
// the kernels-only addon through node-gyp into build/. Set ARPO_SKIP_NATIVE=1
// to skip, ARPO_KERNELS_ONLY=1 to build only the kernels addon.
'use strict';
const { spawnSync } = require('child_process');
const os = require('os');
const path = require('path');

const root = path.resolve(__dirname, '..');
const env = process.env;

function run(cmd, args) {
  console.log(`[arpo] ${cmd} ${args.join(' ')}`);
  const r = spawnSync(cmd, args, { cwd: root, stdio: 'inherit', env });
  return r.status === 0;
}

if (env.ARPO_SKIP_NATIVE === '1') {
  console.log('[arpo] ARPO_SKIP_NATIVE=1: native addon not built');
  process.exit(0);
}

const jobs = String(Math.max(1, os.cpus().length));
const cmakeJs = path.join(path.dirname(require.resolve('cmake-js/package.json')), 'bin', 'cmake-js');
const cudaFlag = env.ARPO_WITH_CUDA === '0' ? ['--CDARPO_WITH_CUDA=OFF'] : [];
if (env.ARPO_KERNELS_ONLY !== '1') {
  if (run(process.execPath, [cmakeJs, 'compile', '-O', 'build-cmake', '-p', jobs, ...cudaFlag])) process.exit(0);
  console.warn('[arpo] cmake-js build failed; falling back to the kernels-only addon (node-gyp)');
}
// node-gyp: npm's own (set for lifecycle scripts), else an installed one, else the one bundled with npm.
const fs = require('fs');
const gypCandidates = [
  env.npm_config_node_gyp,
  (() => { try { return require.resolve('node-gyp/bin/node-gyp.js'); } catch { return undefined; } })(),
  path.join(path.dirname(process.execPath), '..', 'lib', 'node_modules', 'npm', 'node_modules', 'node-gyp', 'bin', 'node-gyp.js'),
].filter((p) => p && fs.existsSync(p));
// Build against Node's own headers when they are installed (no download).
const nodeDir = env.npm_config_nodedir || path.resolve(path.dirname(process.execPath), '..');
const gypArgs = ['rebuild', `-j${jobs}`];
if (fs.existsSync(path.join(nodeDir, 'include', 'node', 'node_api.h'))) gypArgs.push(`--nodedir=${nodeDir}`);
const ok = gypCandidates.length > 0 ? run(process.execPath, [gypCandidates[0], ...gypArgs]) : run('node-gyp', gypArgs);
if (!ok) {
  console.error(['[arpo] could not build the native addon.',
    '  Install the build tools and libtorch:  sudo bash scripts/install-deps.sh',
    '  then rebuild:                          npm run build:native'].join('\n'));
  process.exit(1);
}
