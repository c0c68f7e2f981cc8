// In the generic form a memgraph op must list its token among the results.
"builtin.module"() ({
  %x = "turnip.input"() <{loc = #turnip.loc<0, 0, 64>}> : () -> tensor<4x4xf32>
}) {turnip.devices = 1 : i64, turnip.budget = 1024 : i64} : () -> ()
