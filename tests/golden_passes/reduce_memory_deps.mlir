// PIPELINE: turnip-reduce-memory-deps
// c overwrites x's location: its edge to x's other reader b is needed and stays. d overwrites a's
// location: its edge to c duplicates a data edge and its edge to a is implied by d <- c <- a, so the
// reduction removes both. Data edges are never removed.
builtin.module attributes {turnip.devices = 1 : i64, turnip.budget = 3072 : i64} {
  %n0, %n0t = turnip.input at <0, 0, 1024> {task = "x"} : tensor<16x16xf32>
  %n1, %n1t = turnip.relu %n0 at <0, 1024, 1024> {task = "a"} : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %n2, %n2t = turnip.exp %n0 at <0, 2048, 1024> {task = "b"} : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %n3, %n3t = turnip.relu %n1 at <0, 0, 1024> after [%n2t] {task = "c"} : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %n4, %n4t = turnip.add %n3, %n2 at <0, 1024, 1024> after [%n1t, %n3t] {task = "d"} : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  turnip.output %n4 : tensor<16x16xf32>
}
