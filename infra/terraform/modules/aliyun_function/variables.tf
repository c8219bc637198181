variable "create" {
  description = "Whether to create any resource at all."
  type        = bool
  default     = true
}

variable "name" {
  description = "Function name; also names the RAM role and policy (letters, digits and '-' only) and, lower-cased, the log project."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z][A-Za-z0-9-]{0,47}$", var.name))
    error_message = "name must be 1-48 letters, digits or '-', starting with a letter: it also names the RAM role and policy, whose names allow no '_'."
  }
}

variable "tags" {
  description = "Tags added to the function and RAM role."
  type        = map(string)
  default     = {}
}

variable "image" {
  description = "ACR image of images/aliyun-fc, with tag or digest, in the function's region (registry-vpc.<region>.aliyuncs.com/<ns>/<repo>:<tag>)."
  type        = string

  validation {
    condition     = can(regex("^[^/]+\\.aliyuncs\\.com/[^/]+/[^:@/]+[:@].+$", var.image))
    error_message = "image must be an ACR image with namespace, repository and a tag or digest."
  }
}

variable "acr_pull_resource_arns" {
  description = "ACR resources the function role may pull from; null derives the Personal Edition repository ARN from image."
  type        = list(string)
  default     = null
}

variable "container_entrypoint" {
  description = "Container entrypoint (wires CUDA forward compatibility, then runs the command)."
  type        = list(string)
  default     = ["/opt/spillway/entrypoint.sh"]
}

variable "container_command" {
  description = "Container command: the FC custom-container server on port 9000."
  type        = list(string)
  default     = ["python", "-m", "functions", "serve", "--platform", "aliyun-fc"]
}

variable "cpu" {
  description = "vCPUs per instance: 0.05-16, a multiple of 0.05 (memory in GB must be 1 to 4 times this)."
  type        = number
  default     = 8

  validation {
    condition     = var.cpu >= 0.05 && var.cpu <= 16 && abs(var.cpu * 20 - floor(var.cpu * 20 + 0.5)) < 0.000001
    error_message = "cpu must be a multiple of 0.05 between 0.05 and 16 vCPUs."
  }
}

variable "memory_size" {
  description = "Memory per instance in MB: 64-32768, a multiple of 64."
  type        = number
  default     = 32768

  validation {
    condition     = var.memory_size >= 64 && var.memory_size <= 32768 && var.memory_size % 64 == 0
    error_message = "memory_size must be a multiple of 64 MB between 64 and 32768."
  }
}

variable "disk_size" {
  description = "Writable disk per instance in MB: 512 or 10240 (the image itself does not count)."
  type        = number
  default     = 512

  validation {
    condition     = contains([512, 10240], var.disk_size)
    error_message = "disk_size must be 512 or 10240."
  }
}

variable "timeout" {
  description = "Invocation timeout in seconds."
  type        = number
  default     = 60

  validation {
    condition     = var.timeout >= 1 && var.timeout <= 86400
    error_message = "timeout must be between 1 and 86400 seconds."
  }
}

variable "instance_concurrency" {
  description = "Requests one instance serves at once (Triton batches them on the GPU)."
  type        = number
  default     = 4

  validation {
    condition     = var.instance_concurrency >= 1 && var.instance_concurrency <= 200
    error_message = "instance_concurrency must be between 1 and 200."
  }
}

variable "gpu_type" {
  description = "FC GPU type: fc.gpu.tesla.1, fc.gpu.ampere.1, fc.gpu.ada.1 or g1; null for a CPU-only function."
  type        = string
  default     = "fc.gpu.tesla.1"

  validation {
    condition     = var.gpu_type == null ? true : contains(["fc.gpu.tesla.1", "fc.gpu.ampere.1", "fc.gpu.ada.1", "g1"], var.gpu_type)
    error_message = "gpu_type must be fc.gpu.tesla.1, fc.gpu.ampere.1, fc.gpu.ada.1 or g1, or null."
  }
}

variable "gpu_memory_size" {
  description = "GPU memory per instance in MB (multiple of 1024, within the card's memory)."
  type        = number
  default     = 16384

  validation {
    condition     = var.gpu_memory_size >= 1024 && var.gpu_memory_size % 1024 == 0
    error_message = "gpu_memory_size must be a multiple of 1024 MB."
  }
}

variable "internet_access" {
  description = "Whether instances may reach the internet (the signing key's OSS mount uses the region's internal endpoint and does not need it)."
  type        = bool
  default     = false
}

variable "qualifier" {
  description = "Version or alias the triggers and provisioned instances target."
  type        = string
  default     = "LATEST"
}

variable "models" {
  description = "Models the function loads (SPILLWAY_MODELS) and the warm-up pings name."
  type        = list(string)
  default     = ["add_sub"]

  validation {
    condition     = alltrue([for m in var.models : can(regex("^[A-Za-z0-9_.-]+$", m))])
    error_message = "Each model name may contain only letters, digits, '_', '.' and '-'."
  }
}

variable "environment_variables" {
  description = "Extra environment variables. Never put the signing key here: use signing_key_oss."
  type        = map(string)
  default     = {}

  validation {
    condition = length(setintersection(keys(var.environment_variables), [
      "SPILLWAY_SIGNING_KEY",
      "SPILLWAY_SIGNING_KEY_FILE",
      "SPILLWAY_SIGNING_KEY_SECRET_ARN",
      "SPILLWAY_SIGNING_KEY_SECRET_NAME",
    ])) == 0
    error_message = "The signing key must come from the OSS key file (signing_key_oss), never from a literal variable; SPILLWAY_SIGNING_KEY_SECRET_NAME would stop the function from starting."
  }
}

variable "signing_key_oss" {
  description = "OSS object holding the X-Spillway-Signature key: oss://<bucket>/<object_dir>/<file_name>, mounted read-only at /mnt/spillway-key and read by the function at init (SPILLWAY_SIGNING_KEY_FILE). The bucket must belong to the function's account; endpoint defaults to the region's internal HTTPS endpoint. null for none."
  type = object({
    bucket     = string
    object_dir = string
    file_name  = string
    endpoint   = optional(string)
  })
  default = null

  validation {
    condition     = var.signing_key_oss == null || can(regex("^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$", var.signing_key_oss.bucket))
    error_message = "signing_key_oss.bucket must be an OSS bucket name: 3-63 lower-case letters, digits or '-', not starting or ending with '-'."
  }

  validation {
    condition     = var.signing_key_oss == null || can(regex("^[A-Za-z0-9_-][A-Za-z0-9_.-]*(/[A-Za-z0-9_-][A-Za-z0-9_.-]*)*$", var.signing_key_oss.object_dir))
    error_message = "signing_key_oss.object_dir must be a non-empty folder inside the bucket, without leading or trailing '/' and without '.' or '..' parts (the whole bucket is never mounted)."
  }

  validation {
    condition     = var.signing_key_oss == null || can(regex("^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,254}$", var.signing_key_oss.file_name))
    error_message = "signing_key_oss.file_name must be a plain file name (letters, digits, '_', '.', '-'), not a path."
  }

  validation {
    condition     = var.signing_key_oss == null || try(var.signing_key_oss.endpoint, null) == null || can(regex("^https://[A-Za-z0-9.-]+$", var.signing_key_oss.endpoint))
    error_message = "signing_key_oss.endpoint must be an https:// OSS endpoint (the key must not travel in clear), or null for the region's internal endpoint."
  }
}

variable "allow_unsigned_payload" {
  description = "Accept signatures whose body hash is UNSIGNED-PAYLOAD (needed when the gateway streams bodies in upstream mode)."
  type        = bool
  default     = false
}

variable "reserved_concurrency" {
  description = "Hard cap on concurrent requests of the function (instances x instance_concurrency), and so on spend. Required."
  type        = number

  validation {
    condition     = var.reserved_concurrency > 0 && floor(var.reserved_concurrency) == var.reserved_concurrency
    error_message = "reserved_concurrency must be a whole number > 0."
  }
}

variable "provisioned_instances" {
  description = "Instances kept provisioned (billed while idle); 0 for none."
  type        = number
  default     = 0

  validation {
    condition     = var.provisioned_instances >= 0 && var.provisioned_instances <= 10000
    error_message = "provisioned_instances must be between 0 and 10000."
  }
}

variable "http_auth_type" {
  description = "Auth of the HTTP trigger. FC takes function (FC-signed requests) or anonymous; this module allows function only."
  type        = string
  default     = "function"

  validation {
    condition     = contains(["function", "anonymous"], var.http_auth_type)
    error_message = "http_auth_type must be one of FC's HTTP trigger auth types: function or anonymous."
  }

  validation {
    condition     = var.http_auth_type != "anonymous"
    error_message = "http_auth_type = \"anonymous\" would let anyone call the function: use function."
  }
}

variable "disable_url_internet" {
  description = "Disable the public trigger URL (the gateway then uses the VPC URL)."
  type        = bool
  default     = false
}

variable "log_retention_in_days" {
  description = "Retention of the function's log store in days."
  type        = number
  default     = 30

  validation {
    condition     = var.log_retention_in_days >= 1 && var.log_retention_in_days <= 3650
    error_message = "log_retention_in_days must be between 1 and 3650."
  }
}

variable "warmup_pings" {
  description = "Overlapping warm-up pings per tick (one timer trigger each); an instance takes up to instance_concurrency of them. 0 disables warm-up."
  type        = number
  default     = 1

  validation {
    condition     = var.warmup_pings >= 0 && var.warmup_pings <= 10 && floor(var.warmup_pings) == var.warmup_pings
    error_message = "warmup_pings must be a whole number between 0 and 10 (each ping is one timer trigger)."
  }
}

variable "warmup_cron_expression" {
  description = "Timer of the warm-up tick: FC cron with seconds, the same aligned tick for every trigger so that their pings overlap (not @every, whose triggers drift apart); idle instances are released after 3-5 minutes."
  type        = string
  default     = "0 0/3 * * * *"
}

variable "warmup_dwell_ms" {
  description = "How long each ping holds its instance, so that overlapping pings land on distinct instances."
  type        = number
  default     = 250

  validation {
    condition     = var.warmup_dwell_ms >= 0 && var.warmup_dwell_ms <= 60000 && floor(var.warmup_dwell_ms) == var.warmup_dwell_ms
    error_message = "warmup_dwell_ms must be a whole number between 0 and 60000 (the function's limit)."
  }
}

variable "warmup_probe" {
  description = "Whether each ping runs one synthetic inference per model (inputs from model metadata, never user data)."
  type        = bool
  default     = false
}
