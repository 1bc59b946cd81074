"""What the Google Cloud provisioners share (Cloud TPU VMs now, Compute Engine GPU VMs next):
configuration from TRAINJOBS_GCP_* variables, which cloud errors are worth retrying, the agent's
bootstrap (wheel + startup script) and the reaper of orphaned machines. Imports no cloud SDK beyond
google.api_core (which google-cloud-storage already brings): each provisioner imports its own client.
"""
