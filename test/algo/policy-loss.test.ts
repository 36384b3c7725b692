// Policy-loss settings: defaults from the ARPO reference scripts, verl names
// accepted, every bad field named in the error, the result frozen.
import { DEFAULT_POLICY_LOSS, policyLossSettings } from '../../lib/algo';
import { policyLossConfig } from '../../lib/native/kernels';

describe('policyLossSettings', () => {
  test('defaults are the reference ones (clip 0.2/0.2, dual clip 3, low_var_kl with coefficient 0, token-mean)', () => {
    expect(policyLossSettings()).toEqual({
      clipLow: 0.2,
      clipHigh: 0.2,
      dualClipC: 3,
      klType: 'k3',
      klCoef: 0,
      entropyCoef: 0,
      aggregation: 'token-mean',
      temperature: 1,
      normConstant: 0,
    });
    expect(Object.isFrozen(DEFAULT_POLICY_LOSS)).toBe(true);
  });

  test('overrides apply, verl KL names map to k1/k2/k3, the result is frozen', () => {
    const s = policyLossSettings({ clipHigh: 0.28, klType: 'low_var_kl', klCoef: 0.001, aggregation: 'seq-mean-token-sum-norm', normConstant: 4096, dualClipC: 0 });
    expect(s).toMatchObject({ clipLow: 0.2, clipHigh: 0.28, klType: 'k3', klCoef: 0.001, aggregation: 'seq-mean-token-sum-norm', normConstant: 4096, dualClipC: 0 });
    expect(policyLossSettings({ klType: 'kl' }).klType).toBe('k1');
    expect(policyLossSettings({ klType: 'mse' }).klType).toBe('k2');
    expect(Object.isFrozen(s)).toBe(true);
    expect(() => {
      (s as { clipLow: number }).clipLow = 0.5;
    }).toThrow(TypeError);
  });

  test('bad values name the field, unknown names list the known ones', () => {
    expect(() => policyLossSettings({ clipLow: 1.5 })).toThrow('Expected a number in [0, 1) for clipLow but received 1.5 of type number');
    expect(() => policyLossSettings({ clipHigh: '0.2' })).toThrow('Expected a number >= 0 for clipHigh but received "0.2" of type string');
    expect(() => policyLossSettings({ dualClipC: 0.5 })).toThrow('Expected a number > 1, or 0 to disable the dual clip for dualClipC but received 0.5 of type number');
    expect(() => policyLossSettings({ temperature: 0 })).toThrow(/for temperature but received 0/);
    expect(() => policyLossSettings({ klCoef: -1 })).toThrow(/for klCoef but received -1/);
    expect(() => policyLossSettings({ klType: 'full' })).toThrow('Unknown KL type "full"; known: abs, k1, k2, k3, kl, low_var_kl, mse');
    expect(() => policyLossSettings({ aggregation: 'sum' })).toThrow('Unknown loss aggregation "sum"; known: seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm, token-mean');
    expect(() => policyLossSettings({ aggregation: 'seq-mean-token-sum-norm' })).toThrow(/for normConstant but received 0/);
    expect(() => policyLossSettings({ clipRatio: 0.2 } as never)).toThrow(/Unknown policy-loss setting "clipRatio"; known: aggregation, clipHigh, clipLow/);
  });

  test('validated settings pass straight into the fused-loss kernel wrapper (same field names)', () => {
    const s = policyLossSettings({ clipHigh: 0.28, klType: 'mse', aggregation: 'seq-mean-token-sum-norm', normConstant: 4096, entropyCoef: 0.001 });
    expect(policyLossConfig(s)).toMatchObject({ clipLow: 0.2, clipHigh: 0.28, dualClipC: 3, klType: 1, aggregation: 3, normConstant: 4096 });
    expect(policyLossConfig(policyLossSettings())).toMatchObject({ klType: 2, aggregation: 0, temperature: 1 });
  });
});
