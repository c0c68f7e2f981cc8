// PIPELINE: turnip-minimize-memory-deps
// c reuses a's location and waits on a's reader b and on a's offload; the offload already waits on b
// (reader -> offload -> writer), so minimization drops c's edge to b and keeps the one to the offload.
builtin.module attributes {turnip.devices = 1 : i64, turnip.budget = 3072 : i64} {
  %n0, %n0t = turnip.input at <0, 0, 1024> {task = "x"} : tensor<16x16xf32>
  %n1, %n1t = turnip.relu %n0 at <0, 1024, 1024> {task = "a"} : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %n2, %n2t = turnip.exp %n1 at <0, 2048, 1024> {task = "b"} : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %n3, %n3t = turnip.offload %n1 on 0 to <0, 1024> after [%n2t] {task = "a"} : tensor<16x16xf32>
  %n4, %n4t = turnip.scale %n0 at <0, 1024, 1024> after [%n2t, %n3t] {factor = 2.000000e+00 : f64, task = "c"} : (tensor<16x16xf32>) -> tensor<16x16xf32>
  turnip.output %n2, %n3, %n4 : tensor<16x16xf32>, tensor<16x16xf32>, tensor<16x16xf32>
}
