// Renders vega-lite specs to SVG strings in a plain Node process (vega and
// vega-lite are ESM-only with top-level await, which CommonJS hosts such as
// Jest cannot load). Reads a JSON array of specs on stdin, writes a JSON
// array of SVG strings on stdout.
import * as vl from 'vega-lite';
import * as vega from 'vega';

let input = '';
process.stdin.setEncoding('utf8');
for await (const chunk of process.stdin) input += chunk;
const specs = JSON.parse(input);
const out = [];
for (const spec of specs) {
  const view = new vega.View(vega.parse(vl.compile(spec).spec), { renderer: 'none' });
  try {
    out.push(await view.toSVG());
  } finally {
    view.finalize();
  }
}
process.stdout.write(JSON.stringify(out));
