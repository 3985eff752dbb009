"""exaplan's command line: the front door.

One module per subcommand (plan, estimate, explain, schema, capacity, validate, calibrate,
run, data, list), each a thin shell: `add_parser(sub)` declares its options and `run(args)`
calls a public function of planner/, runtime/ or calibration/ and prints the result.
`cli.main` builds the parser and turns a PlanError into one line on stderr and exit code 2.

This package is the only one that may import every other (planner, runtime, calibration,
machine_models); heavy modules (torch, OR-Tools, scipy) are imported inside `run`, so that
`exaplan --help` and `exaplan plan` start fast and never import torch.
"""
