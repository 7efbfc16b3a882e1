"""What runs inside the sandboxed runner processes: the entry point, the roles (the reference's runner, the
candidate's runner, the device's trusted helper, the build child), the call harness, the guards, the build
hooks and the profiled call. Nothing here imports the trusted parent's modules (`cudal1.eval.*` outside
`inside` and `shared`): a runner holds no verdict and no key, and the candidate's process as little harness
as possible."""
