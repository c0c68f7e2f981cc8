builtin.module attributes {turnip.devices = 2 : i64, turnip.budget = 49152 : i64} {
  %n0, %n0t = turnip.input at <0, 0, 16384> {task = "x"} : tensor<64x64xf32>
  %n1, %n1t = turnip.input in <0, 16384> {task = "w"} : tensor<64x64xf32>
  %n2, %n2t = turnip.reload %n1 at <0, 16384, 16384> {task = "w"} : tensor<64x64xf32>
  %n3, %n3t = turnip.matmul %n0, %n2 at <0, 32768, 16384> {task = "y"} : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
  %n4, %n4t = turnip.move %n3 to 1 at <1, 0, 16384> {task = "z"} : tensor<64x64xf32>
  %n5, %n5t = turnip.offload %n3 on 0 to <16384, 16384> {task = "y"} : tensor<64x64xf32>
  %n6, %n6t = turnip.relu %n0 at <0, 16384, 16384> after[%n3t] {task = "v"} : (tensor<64x64xf32>) -> tensor<64x64xf32>
  turnip.output %n4, %n5, %n6 : tensor<64x64xf32>, tensor<64x64xf32>, tensor<64x64xf32>
}
