// Memory dependencies (`after`) and redundant memory edges (`redundant`) on kernels, moves, offloads, reloads.
builtin.module attributes {turnip.devices = 2 : i64, turnip.budget = 4096 : i64} {
  %n0, %n0t = turnip.input at <0, 0, 1024> {task = "a"} : tensor<16x16xf32>
  %n1, %n1t = turnip.exp %n0 at <0, 1024, 1024> {task = "b"} : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %n2, %n2t = turnip.offload %n1 on 0 to <0, 1024> after [%n0t] {task = "b"} : tensor<16x16xf32>
  %n3, %n3t = turnip.relu %n0 at <0, 1024, 1024> after [%n2t] redundant [%n1t] {task = "c"} : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %n4, %n4t = turnip.move %n3 to 1 at <1, 0, 1024> after [%n0t, %n1t] redundant [%n2t] {task = "d"} : tensor<16x16xf32>
  %n5, %n5t = turnip.reload %n2 at <0, 0, 1024> after [%n3t, %n4t] redundant [%n1t] {task = "b"} : tensor<16x16xf32>
  turnip.output %n4, %n5 : tensor<16x16xf32>, tensor<16x16xf32>
}
