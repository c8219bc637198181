variable "aws_region" {
  description = "AWS region of the Lambda function."
  type        = string
  default     = "us-east-1"
}

variable "aliyun_region" {
  description = "Alibaba Cloud region of the FC function (the ACR image must be in the same region)."
  type        = string
  default     = "cn-hangzhou"
}

variable "name" {
  description = "Name of both functions."
  type        = string
  default     = "spillway-add-sub"
}

variable "models" {
  description = "Models both functions load and warm."
  type        = list(string)
  default     = ["add_sub"]
}

variable "aws_image_tag" {
  description = "Tag of the images/aws-lambda image pushed to the ECR repository this example creates."
  type        = string
  default     = "0.1.0"
}

variable "aws_signing_key_secret_arn" {
  description = "Secrets Manager ARN of the X-Spillway-Signature key (create it out of band); null for IAM auth only."
  type        = string
  default     = null
}

variable "aws_gateway_principal_arns" {
  description = "IAM role(s) of the gateway runner, allowed to call the function URL (SigV4) and Invoke."
  type        = list(string)
  default     = []
}

variable "aws_reserved_concurrency" {
  description = "Concurrency cap of the Lambda function (its spend cap)."
  type        = number
  default     = 10
}

variable "aws_cold_start_ms" {
  description = "Expected cold start of the Lambda function in ms, for the gateway's planning (measure it with bench/)."
  type        = number
  default     = 4000
}

variable "aliyun_image" {
  description = "ACR image of images/aliyun-fc in aliyun_region, with tag or digest."
  type        = string
  default     = "registry-vpc.cn-hangzhou.aliyuncs.com/spillway/aliyun-fc:0.1.0"
}

variable "aliyun_reserved_concurrency" {
  description = "Concurrency cap of the FC function in requests (its spend cap)."
  type        = number
  default     = 8
}

variable "aliyun_cold_start_ms" {
  description = "Expected cold start of the FC GPU function in ms, for the gateway's planning (measure it with bench/)."
  type        = number
  default     = 15000
}
