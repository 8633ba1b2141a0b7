"""Node validation: checks, NVML preflight, collecting a session, writing, the fleet."""
