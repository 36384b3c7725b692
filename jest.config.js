/** Jest: TypeScript through ts-jest (transpile only; `tsc --noEmit` type-checks), ESM-only deps transformed to CJS. */
const esmOnly = ['hyparquet', 'hyparquet-compressors', 'tinybench', 'vega', 'vega-[a-z-]+', 'd3-[a-z-]+', 'delaunator', 'robust-predicates', 'internmap', '@huggingface', 'hysnappy'];
module.exports = {
  testEnvironment: 'node',
  roots: ['<rootDir>/test'],
  testMatch: ['**/*.test.ts'],
  transform: {
    '^.+\\.[tj]sx?$': ['ts-jest', { tsconfig: { allowJs: true, module: 'commonjs', moduleResolution: 'node10', esModuleInterop: true, isolatedModules: true }, diagnostics: false }],
    '^.+\\.mjs$': ['ts-jest', { tsconfig: { allowJs: true, module: 'commonjs', esModuleInterop: true, isolatedModules: true }, diagnostics: false }],
  },
  moduleFileExtensions: ['ts', 'js', 'mjs', 'cjs', 'json', 'node'],
  transformIgnorePatterns: [`/node_modules/(?!(${esmOnly.join('|')})/)`],
  testTimeout: 60000,
};
