#!/usr/bin/env node
// Runs the C++ tests (ctest). Uses the cmake-js build tree when present
// (build-cmake/), else configures a standalone one in build-tests/. Then
// builds and runs the sanitised fuzz targets (native/fuzz/, in build-fuzz/):
// ARPO_NATIVE_FUZZ_CASES seeded cases per target (default 20000).
'use strict';
const { spawnSync } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');

const root = path.resolve(__dirname, '..');
const jobs = String(Math.max(1, os.cpus().length));
function run(cmd, args) {
  const r = spawnSync(cmd, args, { cwd: root, stdio: 'inherit' });
  if (r.status !== 0) process.exit(r.status === null ? 1 : r.status);
}
let dir = path.join(root, 'build-cmake');
if (!fs.existsSync(path.join(dir, 'CMakeCache.txt'))) {
  dir = path.join(root, 'build-tests');
  run('cmake', ['-S', root, '-B', dir, '-DCMAKE_BUILD_TYPE=Release']);
}
run('cmake', ['--build', dir, '-j', jobs]);
run('ctest', ['--test-dir', dir, '--output-on-failure', '-j', jobs]);

const fuzzDir = path.join(root, 'build-fuzz');
const fuzzCases = String(Number(process.env.ARPO_NATIVE_FUZZ_CASES ?? 20000));
run('cmake', ['-S', path.join(root, 'native', 'fuzz'), '-B', fuzzDir, `-DARPO_FUZZ_CASES=${fuzzCases}`]);
run('cmake', ['--build', fuzzDir, '-j', jobs]);
run('ctest', ['--test-dir', fuzzDir, '--output-on-failure', '-j', jobs]);
