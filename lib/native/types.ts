// The whole raw native surface, typed in one place. User-facing wrappers
// (lib/native/kernels.ts, lib/model/) validate arguments before calling these.
export interface NativeAddon {
  readonly hasTorch: boolean;
  readonly hasCuda: boolean;
  noop(): void;
}
