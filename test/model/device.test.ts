// The model's device (model.device, PolicyModel options.device): cpu by
// default and reported by info(); a malformed name is an INVALID_ARGUMENT
// naming the option; on a build without CUDA, asking for cuda fails at
// creation with a message that says what the build lacks, and nothing else
// in the process is disturbed. The CUDA path itself is checked by the C++
// device_test on a machine with a GPU (scripts/gpu-check.sh).
import { tinyConfig } from '../../lib/model/checkpoint';
import { PolicyModel } from '../../lib/model/policy-model';
import { loadNative } from '../../lib/native/loader';
import type { NativeModelAddon } from '../../lib/native/types';
import { validateConfig } from '../../lib/train/config';

const addon = loadNative() as unknown as NativeModelAddon;

test('default device is cpu, reported by info()', async () => {
  const m = await PolicyModel.create(tinyConfig('qwen2'), { seed: 1, threads: 1 });
  expect(m.info().device).toBe('cpu');
  m.dispose();
  const c = await PolicyModel.create(tinyConfig('qwen2'), { seed: 1, threads: 1, device: 'cpu' });
  expect(c.info().device).toBe('cpu');
  c.dispose();
});

test('a malformed device names options.device and the value', async () => {
  for (const bad of ['gpu', 'cuda:', 'CUDA', 'cuda:x', 3]) {
    await expect(PolicyModel.create(tinyConfig('qwen2'), { device: bad as string })).rejects.toThrow(/options\.device/);
  }
});

test('the addon reports what it was built against', () => {
  expect(typeof addon.cudaBuild).toBe('boolean');
  expect(addon.torchVersion).toMatch(/^\d+\.\d+/);
});

(addon.cudaBuild ? test.skip : test)('without CUDA in the build, cuda is refused with what is missing; the process carries on', async () => {
  for (const device of ['cuda', 'cuda:1']) {
    await expect(PolicyModel.create(tinyConfig('qwen2'), { device })).rejects.toThrow(
      new RegExp(`options\\.device is "${device}" but this build of arpo has no CUDA \\(built against libtorch ${addon.torchVersion!.replace(/\./g, '\\.')}`),
    );
  }
  const m = await PolicyModel.create(tinyConfig('qwen2'), { seed: 2, threads: 1 });
  expect(m.info().device).toBe('cpu');
  m.dispose();
});

test('model.device in a run config: cpu, cuda, cuda:N; anything else names the field', () => {
  expect(validateConfig({}).model.device).toBe('cpu');
  expect(validateConfig({ model: { device: 'cuda:2' } }).model.device).toBe('cuda:2');
  expect(() => validateConfig({ model: { device: 'tpu' } })).toThrow(/model\.device/);
});
