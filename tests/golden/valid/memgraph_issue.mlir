// The issue's memgraph example: reload, offload, a move with a location, and a memory dependency.
builtin.module attributes {turnip.devices = 2 : i64, turnip.budget = 49152 : i64} {
  %x, %xt = turnip.input at <0, 0, 16384> : tensor<64x64xf32>
  %w, %wt = turnip.input in <0, 16384> : tensor<64x64xf32>
  %w.reload1, %w.reload1t = turnip.reload %w at <0, 16384, 16384> : tensor<64x64xf32>
  %y, %yt = turnip.matmul %x, %w.reload1 at <0, 32768, 16384> : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
  %z, %zt = turnip.move %y to 1 at <1, 0, 16384> : tensor<64x64xf32>
  %y.offload1, %y.offload1t = turnip.offload %y on 0 to <16384, 16384> : tensor<64x64xf32>
  %v, %vt = turnip.relu %x at <0, 16384, 16384> after [%yt] : (tensor<64x64xf32>) -> tensor<64x64xf32>
  turnip.output %z, %y.offload1, %v : tensor<64x64xf32>, tensor<64x64xf32>, tensor<64x64xf32>
}
