// PIPELINE: turnip-minimize-memory-deps
// c reuses a's location and waits on a's reader b and on a's offload; the offload already waits on b
// (reader -> offload -> writer), so minimization drops c's edge to b and keeps the one to the offload.
builtin.module attributes {turnip.devices = 1 : i64, turnip.budget = 3072 : i64} {
  %x, %xt = turnip.input at <0, 0, 1024> : tensor<16x16xf32>
  %a, %at = turnip.relu %x at <0, 1024, 1024> : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %b, %bt = turnip.exp %a at <0, 2048, 1024> : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %a.offload1, %a.offload1t = turnip.offload %a on 0 to <0, 1024> after [%bt] : tensor<16x16xf32>
  %c, %ct = turnip.scale %x at <0, 1024, 1024> after [%bt, %a.offload1t] {factor = 2.000000e+00 : f64} : (tensor<16x16xf32>) -> tensor<16x16xf32>
  turnip.output %b, %a.offload1, %c : tensor<16x16xf32>, tensor<16x16xf32>, tensor<16x16xf32>
}
