#!/usr/bin/env node
// The `arpo` command: runs the compiled CLI (dist/) when present, else the
// TypeScript sources through ts-node (transpile only).
'use strict';
const fs = require('fs');
const path = require('path');

const root = path.resolve(__dirname, '..');
const compiled = path.join(root, 'dist', 'lib', 'cli', 'main.js');
let main;
if (fs.existsSync(compiled)) {
  main = require(compiled).main;
} else {
  require('ts-node').register({ transpileOnly: true, project: path.join(root, 'tsconfig.json') });
  main = require(path.join(root, 'lib', 'cli', 'main.ts')).main;
}
main(process.argv).then(
  (code) => process.exit(typeof code === 'number' ? code : 0),
  (err) => {
    process.stderr.write(`arpo: ${err && err.message ? err.message : String(err)}\n`);
    if (process.env.ARPO_DEBUG) process.stderr.write(`${err && err.stack}\n`);
    process.exit(1);
  },
);
