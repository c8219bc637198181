terraform {
  required_version = ">= 1.5"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # invoked_via_function_url on aws_lambda_permission, and a NONE function URL granting
      # lambda:InvokeFunction through the URL, both since 6.28.
      version = ">= 6.28"
    }
  }
}
