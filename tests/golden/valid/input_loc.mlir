// A memgraph input at a GPU location: <device, offset, size>.
builtin.module attributes {turnip.devices = 2 : i64, turnip.budget = 65536 : i64} {
  %n0, %n0t = turnip.input at <1, 4096, 8192> {task = "x"} : tensor<32x32xf64>
  turnip.output %n0 : tensor<32x32xf64>
}
