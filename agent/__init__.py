"""The agent: what runs on the provisioned machine (Cloud TPU VM, GPU VM, or a local stand-in).

It reads `<job-dir>/spec.json`, trains, and reports only through GCS (see trainjobs.storage):

    job.py             spec.json in, the local work directory
    status.py          status.json, heartbeat, log capture and upload
    plan.py            the runtime plan (pure: strategy, precision, batch, lr, steps per execution)
    devices.py         hardware detection and the tf.distribute strategy
    data.py            staged dataset download and tf.data pipelines
    input_wait.py      input_wait_fraction, timed at each fetch inside the train function
    models.py          model builders: keras.applications and the user's module
    builtin_models.py  mlp, cnn, resnet
    optimizer.py       optimizer and warmup schedule
    checkpoints.py     checkpoint save, upload, resume
    publisher.py       per-epoch uploads (metrics, checkpoint, status, events) off the training thread
    tensorboard.py     per-epoch scalars as event files
    train.py           model.fit and the per-epoch recorder
    step_time.py       the final metrics' step_time_breakdown, from the epochs' entries
    profiling.py       training.profile: a profiler trace of a window of steps
    keras_compat.py    repairs that let Keras 3 fit under MultiWorkerMirroredStrategy
    export.py          SavedModel, TFLite, accuracy checks, artifact manifest
    run.py             one attempt, start to finish
    __main__.py        command line, signals, exit status
"""
