variable "create" {
  description = "Whether to create any resource at all."
  type        = bool
  default     = true
}

variable "name" {
  description = "Function name; also names the ECR repository, log group, roles and schedules."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,48}$", var.name))
    error_message = "name must be 1-48 letters, digits, '-' or '_' (suffixes are added for roles and schedules)."
  }
}

variable "tags" {
  description = "Tags added to every taggable resource."
  type        = map(string)
  default     = {}
}

variable "create_ecr_repository" {
  description = "Whether to create the ECR repository the image is pushed to. When false, image_uri is required."
  type        = bool
  default     = true
}

variable "ecr_image_tag_mutability" {
  description = "ECR tag mutability. IMMUTABLE keeps a deployed tag from silently changing under the function."
  type        = string
  default     = "IMMUTABLE"

  validation {
    condition     = contains(["IMMUTABLE", "MUTABLE"], var.ecr_image_tag_mutability)
    error_message = "ecr_image_tag_mutability must be IMMUTABLE or MUTABLE."
  }
}

variable "ecr_kms_key_arn" {
  description = "KMS key for ECR encryption at rest; null uses AES256 (AWS-managed)."
  type        = string
  default     = null
}

variable "ecr_keep_images" {
  description = "The ECR lifecycle policy expires all but this many most recent images."
  type        = number
  default     = 10

  validation {
    condition     = var.ecr_keep_images >= 1 && floor(var.ecr_keep_images) == var.ecr_keep_images
    error_message = "ecr_keep_images must be a whole number >= 1."
  }
}

variable "image_uri" {
  description = "Full image URI (tag or digest). Null builds it from the created repository and image_tag."
  type        = string
  default     = null

  validation {
    condition     = var.image_uri == null || can(regex("^[0-9]{12}\\.dkr\\.ecr\\.[a-z0-9-]+\\.amazonaws\\.com(\\.cn)?/[^:@]+[:@].+$", var.image_uri))
    error_message = "image_uri must be an ECR image URI with a tag or digest (ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO:TAG)."
  }
}

variable "image_tag" {
  description = "Tag of the image in the created repository (used when image_uri is null)."
  type        = string
  default     = "0.1.0"
}

variable "architecture" {
  description = "Instruction set of the image: x86_64 or arm64 (images/aws-lambda builds x86_64)."
  type        = string
  default     = "x86_64"

  validation {
    condition     = contains(["x86_64", "arm64"], var.architecture)
    error_message = "architecture must be x86_64 or arm64."
  }
}

variable "memory_size" {
  description = "Memory in MB (128-10240). vCPUs grow with memory: about 1 vCPU per 1769 MB."
  type        = number
  default     = 4096

  validation {
    condition     = var.memory_size >= 128 && var.memory_size <= 10240
    error_message = "memory_size must be between 128 and 10240 MB."
  }
}

variable "ephemeral_storage_size" {
  description = "Size of /tmp in MB (512-10240); Triton's Python-backend shared memory lives there on Lambda."
  type        = number
  default     = 1024

  validation {
    condition     = var.ephemeral_storage_size >= 512 && var.ephemeral_storage_size <= 10240
    error_message = "ephemeral_storage_size must be between 512 and 10240 MB."
  }
}

variable "timeout" {
  description = "Invocation timeout in seconds (1-900)."
  type        = number
  default     = 60

  validation {
    condition     = var.timeout >= 1 && var.timeout <= 900
    error_message = "timeout must be between 1 and 900 seconds."
  }
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
  description = "Extra environment variables. Never put the signing key here: use signing_key_secret_arn."
  type        = map(string)
  default     = {}

  validation {
    condition     = length(setintersection(keys(var.environment_variables), ["SPILLWAY_SIGNING_KEY", "SPILLWAY_SIGNING_KEY_FILE"])) == 0
    error_message = "The signing key must come from Secrets Manager (signing_key_secret_arn), never from a literal variable."
  }
}

variable "kms_key_arn" {
  description = "KMS key that encrypts the function's environment variables; null uses the AWS-managed key."
  type        = string
  default     = null
}

variable "signing_key_secret_arn" {
  description = "Secrets Manager ARN of the X-Spillway-Signature key, read by the function at init. Required when the URL has no IAM auth."
  type        = string
  default     = null

  validation {
    condition     = var.signing_key_secret_arn == null || can(regex("^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:.+$", var.signing_key_secret_arn))
    error_message = "signing_key_secret_arn must be a Secrets Manager secret ARN."
  }
}

variable "signing_key_kms_key_arn" {
  description = "Customer-managed KMS key of the signing secret, if any (granted kms:Decrypt via Secrets Manager only)."
  type        = string
  default     = null
}

variable "allow_unsigned_payload" {
  description = "Accept signatures whose body hash is UNSIGNED-PAYLOAD (needed when the gateway streams bodies in upstream mode)."
  type        = bool
  default     = false
}

variable "reserved_concurrent_executions" {
  description = "Hard cap on concurrent instances, and so on spend. Required."
  type        = number

  validation {
    condition     = var.reserved_concurrent_executions > 0 && floor(var.reserved_concurrent_executions) == var.reserved_concurrent_executions
    error_message = "reserved_concurrent_executions must be a whole number > 0 (0 would disable the function, -1 would lift the cap)."
  }
}

variable "create_alias" {
  description = "Whether to publish a version and point an alias at it (needed for provisioned concurrency)."
  type        = bool
  default     = true
}

variable "alias_name" {
  description = "Name of the alias the URL, schedules and gateway target."
  type        = string
  default     = "live"

  validation {
    condition     = can(regex("^[A-Za-z_][A-Za-z0-9_-]{0,127}$", var.alias_name))
    error_message = "alias_name must start with a letter or '_' and contain only letters, digits, '-' and '_'."
  }
}

variable "provisioned_concurrent_executions" {
  description = "Instances kept initialized on the alias (billed while idle); 0 for none."
  type        = number
  default     = 0

  validation {
    condition     = var.provisioned_concurrent_executions >= 0
    error_message = "provisioned_concurrent_executions must be >= 0."
  }
}

variable "create_function_url" {
  description = "Whether to create a function URL (the gateway's upstream mode needs one)."
  type        = bool
  default     = true
}

variable "function_url_authorization_type" {
  description = "AWS_IAM (SigV4-signed requests only) or NONE; NONE requires signing_key_secret_arn."
  type        = string
  default     = "AWS_IAM"

  validation {
    condition     = contains(["AWS_IAM", "NONE"], var.function_url_authorization_type)
    error_message = "function_url_authorization_type must be AWS_IAM or NONE."
  }
}

variable "invoke_mode" {
  description = "The function URL's invoke mode: BUFFERED (the awslambdaric handler answers whole) or RESPONSE_STREAM (the image's own runtime, python -m functions lambda-runtime, streams generate_stream's tokens as they are made)."
  type        = string
  default     = "BUFFERED"

  validation {
    condition     = contains(["BUFFERED", "RESPONSE_STREAM"], var.invoke_mode)
    error_message = "invoke_mode must be BUFFERED or RESPONSE_STREAM."
  }
}

variable "invoker_principal_arns" {
  description = "IAM roles/users or account IDs allowed to call the URL (AWS_IAM) and Invoke (the gateway's principal)."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for p in var.invoker_principal_arns : can(regex("^([0-9]{12}|arn:aws[a-z-]*:iam::[0-9]{12}:(role|user)/([^*/\\s]+/)*[A-Za-z0-9+=,.@_-]{1,64})$", p))])
    error_message = "invoker_principal_arns entries must be account IDs or IAM role/user ARNs (no wildcards; IAM names are at most 64 characters)."
  }
}

variable "log_retention_in_days" {
  description = "Retention of the function's CloudWatch log group."
  type        = number
  default     = 30

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_in_days)
    error_message = "log_retention_in_days must be one of the values CloudWatch Logs accepts (1, 3, 5, 7, 14, 30, ... 3653)."
  }
}

variable "log_kms_key_arn" {
  description = "KMS key that encrypts the log group; null uses CloudWatch's default encryption."
  type        = string
  default     = null
}

variable "warmup_pings" {
  description = "Overlapping warm-up pings per tick (one schedule each), so about this many instances stay warm; 0 disables warm-up."
  type        = number
  default     = 1

  validation {
    condition     = var.warmup_pings >= 0 && var.warmup_pings <= 50 && floor(var.warmup_pings) == var.warmup_pings
    error_message = "warmup_pings must be a whole number between 0 and 50."
  }
}

variable "warmup_schedule_expression" {
  description = "EventBridge Scheduler expression of the warm-up tick; cron() keeps the pings of all schedules aligned."
  type        = string
  default     = "cron(0/5 * * * ? *)"

  validation {
    condition     = can(regex("^(cron|rate)\\(.+\\)$", var.warmup_schedule_expression))
    error_message = "warmup_schedule_expression must be a cron(...) or rate(...) expression."
  }
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

variable "scheduler_kms_key_arn" {
  description = "KMS key that encrypts the schedules' target input; null uses an AWS-owned key."
  type        = string
  default     = null
}
