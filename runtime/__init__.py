"""exaplan runtime: executes plan files with torch.distributed (next milestone).

It imports only the plan schema (planner.plan, planner.specs) from the planner."""
