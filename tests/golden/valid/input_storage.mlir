// A memgraph input that starts in CPU storage and is reloaded onto GPU 0.
builtin.module attributes {turnip.devices = 1 : i64, turnip.budget = 16384 : i64} {
  %w, %wt = turnip.input in <0, 16384> : tensor<64x64xf32>
  %w.reload1, %w.reload1t = turnip.reload %w at <0, 0, 16384> : tensor<64x64xf32>
  turnip.output %w.reload1 : tensor<64x64xf32>
}
