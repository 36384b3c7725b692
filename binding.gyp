{
  "targets": [
    {
      "target_name": "arpo_kernels",
      "sources": [
        "<!@(node -p \"require('fs').readdirSync('native/kernels').filter(f => f.endsWith('.cc')).map(f => 'native/kernels/' + f).join(' ')\")",
        "<!@(node -p \"require('fs').readdirSync('native/napi').filter(f => f.endsWith('.cc')).map(f => 'native/napi/' + f).join(' ')\")"
      ],
      "include_dirs": [
        "<!(node -p \"require('node-addon-api').include_dir\")",
        "native"
      ],
      "defines": ["NAPI_VERSION=8", "NAPI_CPP_EXCEPTIONS", "NODE_ADDON_API_DISABLE_DEPRECATED"],
      "cflags!": ["-fno-exceptions"],
      "cflags_cc!": ["-fno-exceptions", "-fno-rtti"],
      "cflags_cc": ["-std=c++17", "-O3", "-march=native", "-fexceptions"],
      "ldflags": ["-pthread"]
    }
  ]
}
